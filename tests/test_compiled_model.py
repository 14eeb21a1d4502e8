"""torch.compile of the decoder layers on CPU (``compilation/compiled_model.py``): when it
runs, and that it changes no greedy token (fp32, the tiny Llama-3 model)."""

from __future__ import annotations

import logging

import pytest

from octavo.compilation.compiled_model import (
    COMPILE_ENV,
    CPU_COMPILES_BY_DEFAULT,
    CompileSettings,
    compile_cache_dir,
    compile_decision,
)
from octavo.compilation.config import parse_compilation_config
from octavo.entrypoints.llm import LLM

from greedy_prompts import mixed_prompts, run_batch


@pytest.fixture
def no_compile_env(monkeypatch):
    monkeypatch.delenv(COMPILE_ENV, raising=False)


@pytest.mark.parametrize(
    ("settings", "enabled", "reason"),
    [
        (CompileSettings("cpu", backend="inductor"), True, "backend inductor"),
        (CompileSettings("cpu", backend="eager"), False, "backend eager"),
        (CompileSettings("cpu"), CPU_COMPILES_BY_DEFAULT, "the CPU default"),
        (CompileSettings("cuda", backend="inductor"), False, "CUDA graphs"),
        (CompileSettings("cpu", mode=0, backend="inductor"), False, "compilation mode 0"),
        (CompileSettings("cpu", backend="inductor", enforce_eager=True), False, "--enforce-eager"),
        (CompileSettings("cpu", backend="inductor", world_size=2), False, "parallelism"),
        (CompileSettings("cpu", backend="inductor", lora=True), False, "LoRA"),
        (CompileSettings("cpu", backend="inductor", quantization="int8"), False, "int8"),
    ],
)
def test_compile_decision(no_compile_env, settings, enabled, reason):
    decision = compile_decision(settings)
    assert decision.enabled is enabled
    assert reason in decision.reason


def test_compile_env_overrides_the_backend_not_the_hard_limits(monkeypatch):
    monkeypatch.setenv(COMPILE_ENV, "0")
    assert not compile_decision(CompileSettings("cpu", backend="inductor")).enabled
    monkeypatch.setenv(COMPILE_ENV, "1")
    assert compile_decision(CompileSettings("cpu", backend="eager")).enabled
    assert not compile_decision(CompileSettings("cpu", enforce_eager=True)).enabled
    trial = compile_decision(CompileSettings("cuda"))  # inside the decode graphs: a trial
    assert trial.enabled and trial.reason == "OCTAVO_COMPILE=1 (a trial on cuda)"
    assert not compile_decision(CompileSettings("cuda", world_size=2)).enabled


def test_backend_key_of_compilation_config():
    assert parse_compilation_config('{"backend": "inductor"}').backend == "inductor"
    assert parse_compilation_config("3").backend is None
    with pytest.raises(ValueError, match="backend must be one of inductor, eager"):
        parse_compilation_config({"backend": "cudagraphs"})


def test_compile_cache_under_octavo_cache(monkeypatch, tmp_path):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("OCTAVO_CACHE", str(tmp_path))
    assert compile_cache_dir() == tmp_path / "torch_compile_cache"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    assert compile_cache_dir() == tmp_path / "mine"


def test_compiled_layers_give_eager_greedy_tokens(
    no_compile_env, tiny_folder, smol_tokenizer, caplog
):
    caplog.set_level(logging.INFO, logger="octavo.compilation.compiled_model")
    folder = str(tiny_folder("llama3"))
    prompts = mixed_prompts(smol_tokenizer)[:3]
    engines = {}
    for backend in ("eager", "inductor"):
        config = {"backend": backend}
        engines[backend] = LLM(
            folder, dtype="float32", max_model_len=384, compilation_config=config
        )
    compiled = engines["inductor"].engine.executor.worker.model.layers[0]
    assert "forward" in vars(compiled), "the layer's forward is the compiled one"
    expected = run_batch(engines["eager"], prompts)
    assert run_batch(engines["inductor"], prompts) == expected
    assert "torch.compile: " in caplog.text, "the compile time is logged"
