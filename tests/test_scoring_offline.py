"""``LLM.score`` and ``LLM.classify`` on tiny random BERT folders, against
sentence-transformers' CrossEncoder / SentenceTransformer and HF's softmax (fp32, 1e-5)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from encoder_models import build_bert, build_st_bert
from octavo.entrypoints.llm import LLM

ENGINE = {"device": "cpu", "dtype": "float32"}
QUERY = "w1 w2 w3"
DOCUMENTS = ["w4 w5", "w1 w2 w9 w10 w11", "w30", "w7 w8 w9 w40 w41 w42 w43"]


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory):
    return build_bert(tmp_path_factory.mktemp("ce"), kind="cross_encoder")


def test_score_equals_sentence_transformers_cross_encoder(cross_encoder):
    from sentence_transformers import CrossEncoder

    reference = CrossEncoder(str(cross_encoder), device="cpu").predict(
        [(QUERY, document) for document in DOCUMENTS]
    )
    with LLM(str(cross_encoder), **ENGINE) as llm:
        one_to_many = llm.score(QUERY, DOCUMENTS, use_tqdm=False)
        zipped = llm.score([QUERY] * 2, DOCUMENTS[:2], use_tqdm=False)
        with pytest.raises(ValueError, match="data_1 has 2 texts and data_2 4"):
            llm.score([QUERY] * 2, DOCUMENTS, use_tqdm=False)
        with pytest.raises(ValueError, match="max_model_len of 128"):
            llm.score(QUERY, " ".join(["w5"] * 200), use_tqdm=False)
        truncated = llm.score(QUERY, " ".join(["w5"] * 200), truncate_prompt_tokens=20)
    scores = [output.outputs.score for output in one_to_many]
    np.testing.assert_allclose(scores, reference, atol=1e-5, rtol=0)
    assert [output.outputs.score for output in zipped] == pytest.approx(scores[:2], abs=1e-6)
    assert len(truncated[0].prompt_token_ids) == 20


def test_score_of_a_bi_encoder_is_the_cosine_of_sentence_transformers_vectors(tmp_path):
    from sentence_transformers import SentenceTransformer

    folder = build_st_bert(tmp_path / "st", pooling="MEAN", normalize=False)
    vectors = SentenceTransformer(str(folder), device="cpu").encode([QUERY, *DOCUMENTS])
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    reference = unit[1:] @ unit[0]
    with LLM(str(folder), **ENGINE) as llm:
        scores = [output.outputs.score for output in llm.score(QUERY, DOCUMENTS, use_tqdm=False)]
    np.testing.assert_allclose(scores, reference, atol=1e-5, rtol=0)


def test_classify_equals_hf_softmax(tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    folder = build_bert(tmp_path / "cls", kind="classifier", num_labels=3)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    with torch.no_grad():
        logits = [model(**tokenizer(text, return_tensors="pt")).logits[0] for text in DOCUMENTS]
    reference = torch.stack(logits).softmax(-1).numpy()
    with LLM(str(folder), **ENGINE) as llm:
        outputs = llm.classify(DOCUMENTS, use_tqdm=False)
        with pytest.raises(ValueError, match="one label; this classifier has 3"):
            llm.score(QUERY, DOCUMENTS, use_tqdm=False)
    probs = np.array([output.outputs.probs for output in outputs])
    np.testing.assert_allclose(probs, reference, atol=1e-5, rtol=0)
    assert outputs[0].outputs.num_classes == 3
