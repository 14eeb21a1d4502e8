"""The vLLM command-line flags users paste into ``octavo serve``: each parses into the one
declaration (EngineArgs, or the server's options) and does what vLLM's does.

What the server flags change in responses is checked on a served model in
``test_request_fields.py``; here: parsing, the configuration they build, and the
engine-side effects that need no server.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch

from octavo import LLM, SamplingParams
from octavo.cli import main
from octavo.config import EngineArgs
from octavo.engine.batch_defaults import default_token_budget
from octavo.entrypoints.openai import options
from octavo.entrypoints.openai.cli import listen_args, server_config
from octavo.entrypoints.openai.cli_spellings import vllm_spellings
from octavo.spec_decode.config import SpeculativeConfig

from serve_args import clean_environment, parse  # noqa: F401 (an autouse fixture)

GENERATION_CONFIG = {
    "temperature": 0.6,
    "top_p": 0.9,
    "top_k": 20,
    "repetition_penalty": 1.1,
    "max_new_tokens": 7,
    "do_sample": True,
    "eos_token_id": 2,
}
FROM_GENERATION_CONFIG = {
    "temperature": 0.6,
    "top_p": 0.9,
    "top_k": 20,
    "repetition_penalty": 1.1,
    "max_tokens": 7,
}


def configs(*argv: str):
    """What ``octavo serve ARGV`` would serve with: (EngineArgs, ServerConfig)."""
    args = parse(*argv)
    engine = {option.dest: getattr(args, option.dest) for option in options.ENGINE_OPTIONS}
    engine_args = EngineArgs(model=args.model, **engine)
    return engine_args, server_config(args, engine_args)


@pytest.fixture(scope="module")
def model_with_generation_config(tiny_folder, tmp_path_factory) -> Path:
    """A copy of a tiny model whose generation_config.json sets sampling defaults."""
    folder = tmp_path_factory.mktemp("gen") / "model"
    shutil.copytree(tiny_folder("llama3"), folder)
    (folder / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG))
    return folder


# ----- --generation-config ---------------------------------------------------------------
def test_generation_config_auto_vllm_or_a_folder(model_with_generation_config, tmp_path):
    model = str(model_with_generation_config)
    assert configs(model)[1].sampling_defaults == FROM_GENERATION_CONFIG  # auto
    assert configs(model, "--generation-config", "vllm")[1].sampling_defaults == {}
    other = tmp_path / "other"
    other.mkdir()
    (other / "generation_config.json").write_text(json.dumps({"min_p": 0.1, "eos_token_id": 2}))
    chosen = configs(model, "--generation-config", str(other))[1].sampling_defaults
    assert chosen == {"min_p": 0.1}
    with pytest.raises(ValueError, match="not auto, vllm or a folder"):
        configs(model, "--generation-config", str(tmp_path / "missing"))


def test_offline_llm_uses_the_generation_config_when_given_no_params(
    model_with_generation_config,
):
    from octavo import LLM

    with LLM(
        str(model_with_generation_config),
        dtype="float32",
        max_model_len=64,
        kv_cache_memory=4 << 20,
    ) as llm:
        params = llm.get_default_sampling_params()
        assert (params.temperature, params.top_k, params.max_tokens) == (0.6, 20, 7)
        output = llm.generate("Hello", use_tqdm=False)[0].outputs[0]
        assert len(output.token_ids) <= 7
    with LLM(
        str(model_with_generation_config),
        dtype="float32",
        max_model_len=64,
        kv_cache_memory=4 << 20,
        generation_config="vllm",
    ) as llm:
        assert llm.get_default_sampling_params().max_tokens == 16


# ----- --chat-template, --response-role and the other server flags ----------------------
def test_chat_template_from_a_file_or_inline(tmp_path):
    template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    path = tmp_path / "template.jinja"
    path.write_text(template)
    assert configs("--chat-template", str(path))[1].chat_template == template
    assert configs("--chat-template", template)[1].chat_template == template
    with pytest.raises(ValueError, match="looks like a file path"):
        configs("--chat-template", str(tmp_path / "missing.jinja"))
    with pytest.raises(ValueError, match="not a valid Jinja template"):
        configs("--chat-template", "{% if %}")


def test_server_flags_reach_the_server_config(monkeypatch):
    engine_args, config = configs(
        "--response-role",
        "bot",
        "--return-tokens-as-token-ids",
        "--enable-prompt-tokens-details",
        "--enable-log-requests",
        "--max-logprobs",
        "5",
    )
    assert (config.response_role, config.return_tokens_as_token_ids) == ("bot", True)
    assert config.enable_prompt_tokens_details and config.enable_log_requests
    assert engine_args.max_logprobs == config.max_logprobs == 5
    _, default = configs()
    assert (default.response_role, default.max_logprobs) == ("assistant", 20)
    assert not (default.enable_log_requests or default.return_tokens_as_token_ids)


def test_request_logging_is_off_by_default_and_both_spellings_work(monkeypatch):
    assert parse().enable_log_requests is False  # as in recent vLLM
    assert parse("--enable-log-requests").enable_log_requests is True
    assert parse("--disable-log-requests").enable_log_requests is False
    monkeypatch.setenv("OCTAVO_ENABLE_LOG_REQUESTS", "true")
    assert parse().enable_log_requests is True
    assert parse("--disable-log-requests").enable_log_requests is False


def test_uvicorn_log_level_sets_uvicorns_loggers():
    from fastapi import FastAPI

    from octavo.entrypoints.openai.context import ServerConfig
    from octavo.entrypoints.openai.uvicorn_config import uvicorn_config

    assert listen_args(parse("--log-level", "debug")).log_level == "debug"  # follows
    listen = listen_args(parse("--uvicorn-log-level", "warning"))
    assert listen.log_level == "warning"
    saved = {name: logging.getLogger(name).level for name in ("uvicorn.error", "uvicorn.access")}
    try:
        config = ServerConfig(served_model_names=["m"], model_root="m")
        uvicorn_config(FastAPI(), config, log_level=listen.log_level)
        assert logging.getLogger("uvicorn.error").level == logging.WARNING
        assert logging.getLogger("uvicorn.access").level == logging.WARNING
    finally:
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)
    with pytest.raises(SystemExit):
        parse("--uvicorn-log-level", "loud")


# ----- engine flags ----------------------------------------------------------------------
def test_trust_remote_code_is_refused_with_a_reason(capsys):
    assert main(["serve", "--trust-remote-code"]) == 2
    assert "never runs code shipped with a model" in capsys.readouterr().err
    assert configs("--no-trust-remote-code")[0].trust_remote_code is False


def test_tokenizers_are_loaded_without_remote_code(monkeypatch, tiny_folder):
    import transformers

    from octavo.model_executor.model_folders import load_tokenizer

    seen: list[dict] = []
    real = transformers.AutoTokenizer.from_pretrained

    def spy(*args, **kwargs):
        seen.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", spy)
    load_tokenizer(tiny_folder("llama3"))
    assert seen and seen[-1].get("trust_remote_code") is False


def test_tokenizer_flag_loads_another_folders_tokenizer(tiny_folder, smol_tokenizer, tmp_path):
    from octavo.model_executor.model_folders import load_tokenizer

    other = tmp_path / "tokenizer"
    grown = type(smol_tokenizer).from_pretrained(tiny_folder("llama3"))
    grown.add_tokens(["<extra-token>"])
    grown.save_pretrained(other)
    assert configs("--tokenizer", str(other))[0].tokenizer == str(other)
    model = tiny_folder("llama3")
    assert len(load_tokenizer(model)) == len(smol_tokenizer)
    assert len(load_tokenizer(model, str(other))) == len(smol_tokenizer) + 1
    with pytest.raises(ValueError, match="is not a folder with a tokenizer"):
        load_tokenizer(model, str(tmp_path / "empty"))
    with LLM(str(model), tokenizer=str(other), max_model_len=64, kv_cache_memory=1 << 20) as llm:
        assert len(llm.get_tokenizer()) == len(smol_tokenizer) + 1  # the engine's own


def test_chunked_prefill_off_makes_the_budget_hold_a_whole_prompt():
    cpu = torch.device("cpu")
    on = EngineArgs()
    assert on.enable_chunked_prefill and on.token_budget(cpu, 4096) == 512
    off = EngineArgs(enable_chunked_prefill=False)
    assert off.token_budget(cpu, 4096) == 4096
    assert off.token_budget(cpu, 256) == 512
    with pytest.raises(ValueError, match="smaller than max_model_len"):
        EngineArgs(enable_chunked_prefill=False, max_num_batched_tokens=256).token_budget(cpu, 1024)
    assert parse("--no-enable-chunked-prefill").enable_chunked_prefill is False
    assert parse().enable_chunked_prefill is True


def test_enforce_eager_and_compilation_config_take_vllms_spellings():
    """--enforce-eager and -O0 turn decode graphs off; -O takes vLLM's JSON too."""
    engine_args, _ = configs("--enforce-eager")
    assert engine_args.enforce_eager is True
    assert configs()[0].compilation_config.uses_graphs
    assert not configs("-O0")[0].compilation_config.uses_graphs
    sizes = configs("-O", '{"cudagraph_capture_sizes": [1, 2, 8]}')[0].compilation_config
    assert sizes.capture_sizes(256) == [1, 2, 8]
    assert configs("--compilation-config", "3")[0].compilation_config.uses_graphs
    with pytest.raises(SystemExit):
        parse("-O", '{"splitting_ops": []}')


def test_optimization_levels_and_capture_sizes_as_vllm_032_spells_them(monkeypatch):
    """-O is the optimization level (0 eager, 1 pieces only, 2 and 3 whole decode graphs
    too); -cc, dotted keys and the capture-size flags fill --compilation-config."""

    def compilation(*argv: str):
        return configs(*argv)[0].compilation_config

    assert compilation().graph_mode == "FULL_AND_PIECEWISE"
    assert compilation("-O1").graph_mode == "PIECEWISE"
    assert not compilation("-O", "0").uses_graphs and compilation("-O=0").compile_mode == 0
    assert compilation("--optimization_level", "3").graph_mode == "FULL_AND_PIECEWISE"
    given = compilation("-O0", "-cc", '{"cudagraph_mode": "FULL_DECODE_ONLY"}')
    assert given.graph_mode == "FULL_DECODE_ONLY", "a given cudagraph_mode wins, as in vLLM"
    mode_0 = compilation("-cc.mode=0")  # vLLM's compilation mode: nothing compiled
    assert mode_0.compile_mode == 0 and mode_0.uses_graphs
    assert compilation("--cudagraph-capture-sizes", "8", "1", "2").capture_sizes(256) == [1, 2, 8]
    assert compilation("--cuda-graph-sizes", "4", "2").capture_sizes(256) == [2, 4]
    assert compilation("--max-cudagraph-capture-size", "16").capture_sizes(256)[-1] == 16
    dotted = compilation(
        "-cc",
        '{"cudagraph_mode": "NONE", "max_cudagraph_capture_size": 8}',
        "--compilation_config.cudagraph_mode",
        "piecewise",
        "-cc.cudagraph_capture_sizes+",
        "1,4",
    )
    assert (dotted.graph_mode, dotted.capture_sizes(256)) == ("PIECEWISE", [1, 4])
    assert dotted.max_cudagraph_capture_size == 8, "merged into the flag's own JSON"
    with pytest.raises(ValueError, match="--cudagraph-capture-sizes and compilation_config"):
        configs("--cudagraph-capture-sizes", "1", "-cc.cudagraph_capture_sizes=[2]")
    with pytest.raises(SystemExit):
        parse("-O4")
    monkeypatch.setenv("OCTAVO_CUDAGRAPH_CAPTURE_SIZES", "1,2")
    monkeypatch.setenv("OCTAVO_OPTIMIZATION_LEVEL", "1")
    from_env = compilation()
    assert (from_env.capture_sizes(256), from_env.graph_mode) == ([1, 2], "PIECEWISE")
    offline = EngineArgs(optimization_level=0, cudagraph_capture_sizes=[1, 2])  # LLM(...)
    assert not offline.compilation_config.uses_graphs
    assert offline.compilation_config.capture_sizes(256) == [1, 2]


def test_vllms_loose_spellings_are_read_as_its_parser_reads_them(capsys):
    assert parse("--max_model_len", "512", "--tool-call-parser", "llama3_json").max_model_len == 512
    assert parse("--tool-call-parser", "llama3_json").tool_call_parser == "llama3_json"
    assert vllm_spellings(["serve", "--hf_overrides.rope_scaling.factor=4", "--", "--a_b"]) == [
        "serve",
        "--hf-overrides",
        '{"rope_scaling": {"factor": 4}}',
        "--",
        "--a_b",
    ]
    kept = ["bench", "serve", "--serve-args", "--max_model_len 1.5k", "--a_b=c d"]
    assert vllm_spellings(kept) == [*kept[:3], "--max_model_len 1.5k", "--a-b=c d"]
    assert vllm_spellings(["-O.level", "1", "-cc=3"]) == [
        "--compilation-config=3",
        "--compilation-config",
        '{"level": 1}',
    ]
    assert main(["serve", "-cc.cudagraph_mode"]) == 2
    assert "--compilation-config.cudagraph_mode needs a value" in capsys.readouterr().err


def test_kv_cache_memory_takes_vllm_032s_name_too():
    assert configs("--kv-cache-memory-bytes", "64MiB")[0].kv_cache_memory == 64 * 2**20
    offline = EngineArgs.from_kwargs(None, {"kv_cache_memory_bytes": 1 << 20})  # LLM(...)
    assert offline.kv_cache_memory == 1 << 20
    with pytest.raises(ValueError, match="not both"):
        EngineArgs.from_kwargs(None, {"kv_cache_memory_bytes": 1, "kv_cache_memory": 2})


def test_throughput_mode_doubles_the_default_batch_and_step_as_vllm_does():
    cpu = torch.device("cpu")
    balanced, throughput = configs()[0], configs("--performance-mode", "throughput")[0]
    assert (balanced.max_num_seqs, balanced.token_budget(cpu)) == (256, 512)
    assert (throughput.max_num_seqs, throughput.token_budget(cpu)) == (512, 1024)
    given = configs("--performance-mode=throughput", "--max-num-seqs", "8")[0]
    assert given.max_num_seqs == 8, "a given value is kept"
    assert default_token_budget(cpu, offline=True, mode="throughput") == 4096  # LLM(...)
    with pytest.raises(SystemExit):
        parse("--performance-mode", "fast")


def test_old_speculative_flags_build_the_same_config(caplog):
    caplog.set_level(logging.WARNING, logger="octavo.config")
    engine_args, _ = configs("--speculative-model", "[ngram]", "--num-speculative-tokens", "3")
    assert engine_args.speculative_config == SpeculativeConfig.parse(
        {"method": "ngram", "num_speculative_tokens": 3}
    )
    assert "deprecated" in caplog.text and "--speculative-config" in caplog.text
    draft = EngineArgs(speculative_model="/models/draft", num_speculative_tokens=2)
    assert draft.speculative_config == SpeculativeConfig.parse(
        {"model": "/models/draft", "num_speculative_tokens": 2}
    )
    assert (draft.speculative_model, draft.num_speculative_tokens) == (None, None)
    with pytest.raises(ValueError, match="go together"):
        EngineArgs(speculative_model="[ngram]")
    with pytest.raises(ValueError, match="not both"):
        EngineArgs(
            speculative_config={"method": "ngram", "num_speculative_tokens": 2},
            num_speculative_tokens=2,
            speculative_model="[ngram]",
        )


def test_the_engine_itself_holds_requests_to_max_logprobs(tiny_folder):
    """Code that adds requests to the engine directly (not through LLM or the server) is held
    to --max-logprobs too."""
    with LLM(str(tiny_folder("llama3")), max_model_len=64, kv_cache_memory=1 << 20) as llm:
        with pytest.raises(ValueError, match="greater than max allowed: 20"):
            llm.engine.add_request("too-many", [1, 2, 3], SamplingParams(logprobs=21))
        assert not llm.engine.has_unfinished_requests()
