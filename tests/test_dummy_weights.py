"""``--load-format dummy`` (vLLM's flag): random weights on the device, no checkpoint read;
a folder with only config.json and a tokenizer loads and generates."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from octavo.model_executor.dummy_weights import DUMMY_HIGH, DUMMY_LOW, fill_dummy_weights
from octavo.model_executor.load_formats import check_load_format

from tiny_models import TINY_CONFIGS

ENGINE = dict(dtype="float32", max_model_len=64, kv_cache_memory=4 << 20, device="cpu")


@pytest.fixture(scope="module")
def config_only_folder(tmp_path_factory, smol_tokenizer):
    """TINY_CONFIGS' llama3 as config.json and a tokenizer: no weight file at all."""
    folder = tmp_path_factory.mktemp("config-only")
    config = {**TINY_CONFIGS["llama3"], "vocab_size": len(smol_tokenizer)}
    config["bos_token_id"], config["eos_token_id"] = (
        smol_tokenizer.bos_token_id,
        smol_tokenizer.eos_token_id,
    )
    (folder / "config.json").write_text(json.dumps(config))
    smol_tokenizer.save_pretrained(folder)
    assert not list(folder.glob("*.safetensors"))
    return folder


def test_a_config_only_folder_loads_dummy_weights_and_generates(config_only_folder):
    from octavo import LLM, SamplingParams

    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    with LLM(str(config_only_folder), load_format="dummy", **ENGINE) as llm:
        model = llm.engine.executor.worker.model
        weights = [p for p in model.parameters() if p.is_floating_point()]
        assert all(p.min() >= DUMMY_LOW and p.max() <= DUMMY_HIGH for p in weights)
        assert all(p.abs().sum() > 0 for p in weights)  # every parameter drawn, none left 0
        outputs = llm.generate([[5, 6, 7, 8]], params, use_tqdm=False)
    assert len(outputs[0].outputs[0].token_ids) == 5


def test_auto_on_a_config_only_folder_fails_saying_no_weights(config_only_folder):
    from octavo import LLM

    with pytest.raises(ValueError, match=r"no \*\.safetensors weights"):
        LLM(str(config_only_folder), **ENGINE)


def test_dummy_weights_are_seeded_small_and_fill_a_tied_head_once():
    def tied() -> nn.Module:
        model = nn.Sequential(nn.Embedding(50, 8), nn.Linear(8, 50, bias=False))
        model[1].weight = model[0].weight
        return model

    first, second = tied(), tied()
    assert fill_dummy_weights(first) == fill_dummy_weights(second) == 1
    assert torch.equal(first[0].weight, second[0].weight)
    assert first[0].weight.abs().max() <= DUMMY_HIGH and first[0].weight.std() > 0


def test_checkpoint_only_layouts_and_unknown_formats_are_refused():
    for quantization in ("gguf", "gptq", "awq"):
        with pytest.raises(ValueError, match=f"cannot make {quantization} weights"):
            check_load_format("dummy", quantization)
    with pytest.raises(ValueError, match="not one of auto, dummy"):
        check_load_format("pt", None)
    check_load_format("dummy", "int8")  # quantized at load from whatever weights it gets
    check_load_format("auto", "gguf")


def test_the_serve_flag_is_spelled_as_vllms():
    from octavo.entrypoints.openai.options import ENGINE_OPTIONS

    option = next(option for option in ENGINE_OPTIONS if option.flag == "--load-format")
    assert option.default == "auto" and option.choices == ("auto", "dummy")


def test_int8_quantizes_dummy_weights_at_load_as_any_others(config_only_folder):
    from octavo import LLM, SamplingParams

    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    with LLM(str(config_only_folder), load_format="dummy", quantization="int8", **ENGINE) as llm:
        outputs = llm.generate([[5, 6, 7]], params, use_tqdm=False)
    assert len(outputs[0].outputs[0].token_ids) == 3
