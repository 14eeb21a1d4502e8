"""/score, /rerank, /classify and /pooling over HTTP on tiny random BERT folders: scores
equal sentence-transformers' CrossEncoder.predict and the cosine of SentenceTransformer's
vectors, class probabilities HF's softmax (fp32, 1e-5); bad input is a 400 naming its field."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
import torch

from encoder_models import build_bert, build_st_bert
from octavo.pooling.params import PoolerConfig, PoolingType
from octavo.pooling.runner import RunnerSettings

from server_harness import ThreadedServer, build_local_app

ENGINE = {"dtype": "float32", "kv_cache_memory": 2**22}
QUERY = "w1 w2 w3"
DOCUMENTS = ["w4 w5", "w1 w2 w9 w10 w11", "w30", "w7 w8 w9 w40 w41 w42 w43"]
TOO_LONG = " ".join(["w5"] * 200)  # more than max_position_embeddings=128


def serve(folder):
    app = build_local_app(str(folder), **ENGINE)
    with ThreadedServer(app) as running:
        yield running.wait_ready()


@pytest.fixture(scope="module")
def cross_folder(tmp_path_factory):
    return build_bert(tmp_path_factory.mktemp("ce"), kind="cross_encoder")


@pytest.fixture(scope="module")
def cross_server(cross_folder):
    yield from serve(cross_folder)


@pytest.fixture(scope="module")
def cross_reference(cross_folder) -> np.ndarray:
    from sentence_transformers import CrossEncoder

    model = CrossEncoder(str(cross_folder), device="cpu")
    return model.predict([(QUERY, document) for document in DOCUMENTS])


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=60)


@pytest.mark.parametrize("path", ["/score", "/v1/score"])
def test_score_equals_cross_encoder_predict(cross_server, cross_reference, path):
    reply = post(cross_server, path, {"text_1": QUERY, "text_2": DOCUMENTS})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["object"] == "list" and body["usage"]["prompt_tokens"] > 0
    assert [item["index"] for item in body["data"]] == [0, 1, 2, 3]
    assert {item["object"] for item in body["data"]} == {"score"}
    scores = [item["score"] for item in body["data"]]
    np.testing.assert_allclose(scores, cross_reference, atol=1e-5, rtol=0)
    zipped = post(cross_server, path, {"queries": [QUERY] * 2, "documents": DOCUMENTS[:2]})
    assert [item["score"] for item in zipped.json()["data"]] == pytest.approx(scores[:2])


@pytest.mark.parametrize("path", ["/rerank", "/v1/rerank", "/v2/rerank"])
def test_rerank_orders_by_score_and_keeps_top_n(cross_server, cross_reference, path):
    documents = [DOCUMENTS[0], {"text": DOCUMENTS[1]}, *DOCUMENTS[2:]]
    reply = post(cross_server, path, {"query": QUERY, "documents": documents, "top_n": 2})
    assert reply.status_code == 200, reply.text
    results = reply.json()["results"]
    order = list(np.argsort(-cross_reference))
    assert [result["index"] for result in results] == order[:2]
    for result in results:
        assert result["relevance_score"] == pytest.approx(
            cross_reference[result["index"]], abs=1e-5
        )
        assert result["document"] == {"text": DOCUMENTS[result["index"]]}
    every = post(cross_server, path, {"query": QUERY, "documents": DOCUMENTS, "top_n": 99})
    assert [result["index"] for result in every.json()["results"]] == order


def test_pooling_returns_the_classifiers_logit(cross_server):
    reply = post(cross_server, "/pooling", {"input": [QUERY]})
    assert reply.status_code == 200, reply.text
    item = reply.json()["data"][0]
    assert item["object"] == "pooling" and len(item["data"]) == 1
    (probability,) = post(cross_server, "/classify", {"input": QUERY}).json()["data"][0]["probs"]
    assert probability == pytest.approx(1 / (1 + np.exp(-item["data"][0])), abs=1e-6)


@pytest.mark.parametrize(
    ("path", "body", "param", "words"),
    [
        ("/rerank", {"query": QUERY, "documents": []}, "documents", "empty"),
        ("/rerank", {"query": QUERY, "documents": DOCUMENTS, "top_n": -1}, "top_n", "top_n"),
        ("/score", {"text_1": [QUERY] * 2, "text_2": DOCUMENTS}, "text_1", "text_1 has 2"),
        ("/score", {"text_1": QUERY, "text_2": []}, "text_2", "empty"),
        ("/score", {"text_1": QUERY}, "text_1", "required"),
        ("/score", {"text_1": QUERY, "text_2": TOO_LONG}, "truncate_prompt_tokens", "of 128"),
        ("/v1/embeddings", {"input": QUERY}, "model", "classifier"),
        ("/classify", {"input": QUERY}, None, None),  # one label: its sigmoid, 200
        ("/v1/completions", {"prompt": QUERY, "max_tokens": 2}, None, "--runner pooling"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(cross_server, path, body, param, words):
    reply = post(cross_server, path, body)
    if path == "/classify":
        assert reply.status_code == 200 and reply.json()["data"][0]["num_classes"] == 1
        return
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    if param is not None:
        assert error["param"] == param
    assert words in error["message"]


def test_truncate_prompt_tokens_shortens_long_pairs(cross_server):
    body = {"text_1": QUERY, "text_2": TOO_LONG, "truncate_prompt_tokens": 20}
    reply = post(cross_server, "/score", body)
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["prompt_tokens"] == 20


def test_scoring_on_a_generate_runner_names_runner_pooling():
    settings = RunnerSettings("generate", PoolerConfig(PoolingType.LAST, True, 64))
    for task in ("score", "classify", "pooling"):
        with pytest.raises(ValueError, match="--runner pooling"):
            settings.check_task(task)
    settings.check_task("embed")  # a decoder's embeddings stay allowed


def test_bi_encoder_score_is_the_cosine_of_sentence_transformers_vectors(tmp_path):
    from sentence_transformers import SentenceTransformer

    folder = build_st_bert(tmp_path / "st", pooling="CLS", normalize=True)
    vectors = SentenceTransformer(str(folder), device="cpu").encode([QUERY, *DOCUMENTS])
    reference = vectors[1:] @ vectors[0]
    for server in serve(folder):
        reply = post(server, "/v1/score", {"text_1": QUERY, "text_2": DOCUMENTS})
        assert reply.status_code == 200, reply.text
        scores = [item["score"] for item in reply.json()["data"]]
        np.testing.assert_allclose(scores, reference, atol=1e-5, rtol=0)
        assert post(server, "/classify", {"input": QUERY}).json()["error"]["param"] == "model"


def test_classify_equals_hf_softmax_with_id2label(tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    folder = build_bert(tmp_path / "cls", kind="classifier", num_labels=3)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    with torch.no_grad():
        logits = [model(**tokenizer(text, return_tensors="pt")).logits[0] for text in DOCUMENTS]
    reference = torch.stack(logits).softmax(-1).numpy()
    for server in serve(folder):
        reply = post(server, "/classify", {"input": DOCUMENTS})
        assert reply.status_code == 200, reply.text
        data = reply.json()["data"]
        np.testing.assert_allclose([item["probs"] for item in data], reference, atol=1e-5)
        labels = [model.config.id2label[int(row.argmax())] for row in reference]
        assert [item["label"] for item in data] == labels
        assert {item["num_classes"] for item in data} == {3}
        score = post(server, "/score", {"text_1": QUERY, "text_2": DOCUMENTS})
        assert score.status_code == 400 and "one label" in score.json()["error"]["message"]
