"""sentence-transformers folders with a ``Dense`` module (Transformer → Pooling → Dense →
Normalize), written by sentence-transformers' own ``save``: Octavo's vectors equal
``SentenceTransformer(folder).encode`` in fp32, for a BERT bi-encoder and a decoder
embedding model; a module order Octavo cannot run is refused."""

from __future__ import annotations

import json

import pytest
import torch

from encoder_models import build_st_bert
from octavo import LLM
from octavo.pooling.model_defaults import read_pooler_config

from embedding_models import build_embedding_model

TOLERANCE = 1e-5
TEXTS = ["w1 w2 w3", "w10 w11 w12 w13 w14 w15 w16 w17 w18 w19 w20", "w7"]
DENSE_SIZE = 16


def add_dense(source, folder) -> None:
    """``source``'s modules with a Dense (64 → 16, Tanh) before Normalize, saved anew."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Dense, Normalize

    model = SentenceTransformer(str(source), device="cpu")
    torch.manual_seed(99)
    dense = Dense(model.get_embedding_dimension(), DENSE_SIZE)
    with torch.no_grad():
        dense.linear.weight.normal_(0.0, 0.3)
        dense.linear.bias.normal_(0.0, 0.3)
    SentenceTransformer(modules=[model[0], model[1], dense, Normalize()], device="cpu").save(
        str(folder)
    )


def assert_equals_sentence_transformers(folder) -> None:
    from sentence_transformers import SentenceTransformer

    want = SentenceTransformer(str(folder), device="cpu").encode(TEXTS, convert_to_tensor=True)
    llm = LLM(str(folder), device="cpu", dtype="float32", runner="pooling")
    try:
        outputs = llm.embed(TEXTS, use_tqdm=False)
    finally:
        llm.shutdown()
    got = torch.tensor([output.outputs.embedding for output in outputs])
    assert got.shape == (len(TEXTS), DENSE_SIZE)
    assert (got - want.cpu()).abs().max() < TOLERANCE


def test_bert_with_dense_equals_sentence_transformers(tmp_path):
    source = build_st_bert(tmp_path / "st", pooling="MEAN", normalize=False)
    add_dense(source, tmp_path / "dense")
    assert_equals_sentence_transformers(tmp_path / "dense")


def test_decoder_with_dense_equals_sentence_transformers(tmp_path, smol_tokenizer):
    source = build_embedding_model(tmp_path / "st", smol_tokenizer, "LAST", normalize=False)
    add_dense(source, tmp_path / "dense")
    assert_equals_sentence_transformers(tmp_path / "dense")


def test_dense_after_normalize_is_refused(tmp_path):
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Norm", "type": "sentence_transformers.models.Normalize"},
        {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"},
    ]
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="Normalize → Dense"):
        read_pooler_config(tmp_path, hidden_size=8)
