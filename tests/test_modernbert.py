"""ModernBERT through ``LLM(..., runner="pooling")`` equals HF transformers in fp32.

Tiny random checkpoints with a small local window (8: each token sees 4 either side) and
prompts longer than it, so the local layers' window both ways, the global layers, both
rope tables, the GeGLU MLP and the norms without bias all decide the result; the
classifier pools by CLS or by mean (``classifier_pooling``).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from encoder_models import bert_tokenizer
from octavo import LLM
from octavo.attention.torch_ops import visible_keys

TOLERANCE = 1e-5
PROMPTS = [[2, 17, 33, 5, 99, 4, 3], list(range(5, 45)), [2, 7, 3], list(range(100, 121))]
TINY = {
    "vocab_size": 300,
    "hidden_size": 64,
    "num_hidden_layers": 3,  # global, local, local
    "num_attention_heads": 4,
    "intermediate_size": 96,
    "max_position_embeddings": 128,
    "global_attn_every_n_layers": 3,
    "local_attention": 8,
    "initializer_range": 0.2,
    "pad_token_id": 0,
    "bos_token_id": 2,
    "eos_token_id": 3,
    "cls_token_id": 2,
    "sep_token_id": 3,
}


def build(folder, classifier_pooling: str | None = None):
    """A random ModernBERT folder and its HF model (a classifier with 3 labels when
    ``classifier_pooling`` is given)."""
    from transformers import ModernBertConfig, ModernBertForSequenceClassification, ModernBertModel

    torch.manual_seed(1234)
    if classifier_pooling is None:
        model = ModernBertModel(ModernBertConfig(**TINY))
    else:
        config = ModernBertConfig(**TINY, num_labels=3, classifier_pooling=classifier_pooling)
        model = ModernBertForSequenceClassification(config)
    model.save_pretrained(folder)
    bert_tokenizer().save_pretrained(folder)
    return model.eval()


def engine_vectors(folder) -> list[torch.Tensor]:
    llm = LLM(str(folder), device="cpu", dtype="float32", runner="pooling")
    try:
        outputs = llm.embed([{"prompt_token_ids": p} for p in PROMPTS], use_tqdm=False)
    finally:
        llm.shutdown()
    return [torch.tensor(output.outputs.embedding) for output in outputs]


def test_embeddings_equal_hf(tmp_path):
    hf = build(tmp_path)
    got = engine_vectors(tmp_path)
    for prompt, vector in zip(PROMPTS, got, strict=True):
        with torch.no_grad():
            cls_row = hf(torch.tensor([prompt])).last_hidden_state[0, 0]
        assert (vector - F.normalize(cls_row, dim=-1)).abs().max() < TOLERANCE


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_classifier_equals_hf(tmp_path, pooling):
    hf = build(tmp_path, pooling)
    got = engine_vectors(tmp_path)
    for prompt, logits in zip(PROMPTS, got, strict=True):
        with torch.no_grad():
            want = hf(torch.tensor([prompt])).logits[0]
        assert (logits - want).abs().max() < TOLERANCE


def test_window_both_ways_inside_a_span():
    positions = torch.arange(12)
    visible = visible_keys(positions, positions, 3, [(0, 12)], both_ways=True)
    distance = (positions[:, None] - positions[None, :]).abs()
    assert torch.equal(visible, distance < 3)
