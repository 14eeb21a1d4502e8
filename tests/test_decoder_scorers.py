"""Decoders as scorers: Qwen2/Qwen3 ``ForSequenceClassification`` checkpoints give HF's
logits, and a Qwen3 causal LM served as the Qwen3-Reranker is (vLLM's ``--hf-overrides``
with ``classifier_from_token``) gives ``sigmoid(logit) = P(yes)`` under a softmax over
HF's ``[no, yes]`` last-token logits. Tiny random fp32 models with the SmolLM2 tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from octavo import LLM
from octavo.model_executor.model_config import ModelConfig
from octavo.model_executor.models.registry import is_pooling_architecture
from octavo.model_executor.models.sequence_classification import token_head_of, token_ids

QWEN3 = {
    "model_type": "qwen3",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "max_position_embeddings": 512,
    "tie_word_embeddings": True,
}
QWEN2 = {
    **{key: value for key, value in QWEN3.items() if key != "head_dim"},
    "model_type": "qwen2",
    "tie_word_embeddings": False,
}
PROMPTS = [[1, 17, 233, 4051, 9], [3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 377], [610, 987]]
RERANKER = {
    "architectures": ["Qwen3ForSequenceClassification"],
    "classifier_from_token": ["no", "yes"],
    "is_original_qwen3_reranker": True,
}


def build(folder: Path, tokenizer, auto_class: str, architecture: str, **config) -> tuple:
    """A random fp32 checkpoint (and its tokenizer) saved to ``folder``, and the HF model."""
    import transformers

    raw = {**config, "vocab_size": len(tokenizer), "architectures": [architecture]}
    hf_config = transformers.AutoConfig.for_model(raw.pop("model_type"), **raw)
    torch.manual_seed(7)
    model = getattr(transformers, auto_class).from_config(hf_config, dtype=torch.float32)
    with torch.no_grad():
        for parameter in model.parameters():  # larger weights: logits far from each other
            parameter.normal_(0.0, 0.2)
    model.eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder, model


def engine_vectors(folder: Path, **kwargs) -> torch.Tensor:
    """Octavo's pooled vectors of ``PROMPTS``, in one batch."""
    llm = LLM(str(folder), device="cpu", dtype="float32", **kwargs)
    try:
        outputs = llm.embed([{"prompt_token_ids": ids} for ids in PROMPTS], use_tqdm=False)
    finally:
        llm.shutdown()
    return torch.tensor([output.outputs.embedding for output in outputs])


@pytest.mark.parametrize(
    ("config", "architecture"),
    [(QWEN2, "Qwen2ForSequenceClassification"), (QWEN3, "Qwen3ForSequenceClassification")],
)
def test_sequence_classifier_logits_equal_hf(tmp_path, smol_tokenizer, config, architecture):
    assert is_pooling_architecture(architecture)  # --runner pooling is picked for it
    folder, hf = build(
        tmp_path,
        smol_tokenizer,
        "AutoModelForSequenceClassification",
        architecture,
        **config,
        num_labels=3,
    )
    got = engine_vectors(folder)
    with torch.no_grad():  # one prompt at a time: HF needs a pad token to batch them
        want = torch.cat([hf(torch.tensor([ids])).logits for ids in PROMPTS])
    assert got.shape == (len(PROMPTS), 3)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_qwen3_reranker_scores_yes_probability(tmp_path, smol_tokenizer):
    """Tied embeddings, as Qwen3-Reranker-0.6B: the head comes from the embedding's rows."""
    folder, hf = build(
        tmp_path, smol_tokenizer, "AutoModelForCausalLM", "Qwen3ForCausalLM", **QWEN3
    )
    got = engine_vectors(folder, hf_overrides=RERANKER)
    no, yes = smol_tokenizer.convert_tokens_to_ids(["no", "yes"])
    with torch.no_grad():
        last = torch.cat([hf(torch.tensor([ids])).logits[:, -1] for ids in PROMPTS])
    want = torch.softmax(last[:, [no, yes]], dim=-1)[:, 1]
    assert got.shape == (len(PROMPTS), 1)
    torch.testing.assert_close(torch.sigmoid(got[:, 0]), want, atol=1e-5, rtol=0)


def test_classifier_from_token_rows_are_labels(tmp_path, smol_tokenizer):
    """Without the 2-way conversion each token's LM-head row (untied here) is one label."""
    config = {**QWEN3, "tie_word_embeddings": False}
    folder, hf = build(
        tmp_path, smol_tokenizer, "AutoModelForCausalLM", "Qwen3ForCausalLM", **config
    )
    tokens = ["no", "yes", "maybe"]
    overrides = {
        "architectures": ["Qwen3ForSequenceClassification"],
        "classifier_from_token": tokens,
    }
    got = engine_vectors(folder, hf_overrides=overrides)
    ids = smol_tokenizer.convert_tokens_to_ids(tokens)
    with torch.no_grad():
        want = torch.cat([hf(torch.tensor([p])).logits[:, -1, ids] for p in PROMPTS])
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_unknown_classifier_token_is_a_clear_error(tmp_path, smol_tokenizer):
    smol_tokenizer.save_pretrained(tmp_path)
    assert token_ids(tmp_path, ("no", "yes")) == smol_tokenizer.convert_tokens_to_ids(["no", "yes"])
    with pytest.raises(ValueError, match="'zzz-not-a-token' is not a token"):
        token_ids(tmp_path, ("no", "zzz-not-a-token"))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"classifier_from_token": "yes"}, "must be a list of tokens"),
        ({"classifier_from_token": ["a", "b", "c"], "method": "from_2_way_softmax"}, "two tokens"),
        ({"classifier_from_token": ["a"], "method": "softmax"}, "method must be one of"),
        ({"method": "no_post_processing"}, "needs classifier_from_token"),
    ],
)
def test_bad_token_head_settings_are_refused(overrides, message):
    raw = {**QWEN3, "architectures": ["Qwen3ForSequenceClassification"], "vocab_size": 100}
    config = ModelConfig.from_dict({**raw, **overrides})
    with pytest.raises(ValueError, match=message):
        token_head_of(config)
