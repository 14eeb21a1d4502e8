"""Pooling and /v1/embeddings: tiny random decoder embedding models written by the test,
compared with sentence-transformers on the same folder (fp32, 1e-5)."""

from __future__ import annotations

import base64

import httpx
import numpy as np
import pytest

from octavo.entrypoints.llm import LLM
from octavo.pooling.params import PoolingParams

from embedding_models import build_embedding_model
from server_harness import ThreadedServer, build_local_app, openai_client

TEXTS = [
    "hello world",
    "The quick brown fox jumps over the lazy dog. " * 6,  # several chunks of 16 tokens
    "a",
    "Embeddings map text to vectors; similar texts land close together.",
]
ENGINE = {"dtype": "float32", "kv_cache_memory": 2**24, "max_num_batched_tokens": 16}


def st_reference(folder, texts) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(folder), device="cpu")
    return model.encode(texts, convert_to_numpy=True, batch_size=len(texts))


@pytest.fixture(scope="module")
def last_folder(tmp_path_factory, smol_tokenizer):
    return build_embedding_model(tmp_path_factory.mktemp("emb-last"), smol_tokenizer, "LAST")


@pytest.fixture(scope="module")
def last_reference(last_folder) -> np.ndarray:
    """sentence-transformers' vectors of ``TEXTS`` on ``last_folder``, computed once."""
    return st_reference(last_folder, TEXTS)


@pytest.mark.parametrize("pooling", ["LAST", "MEAN", "CLS"])
def test_llm_embed_equals_sentence_transformers(request, tmp_path, smol_tokenizer, pooling):
    """Chunked prefill (16-token steps) and batching change nothing: same vectors as
    sentence-transformers' padded batch, to 1e-5. (LAST: the module's LAST model.)"""
    if pooling == "LAST":
        folder = request.getfixturevalue("last_folder")
        reference = request.getfixturevalue("last_reference")
    else:
        folder = build_embedding_model(tmp_path / "m", smol_tokenizer, pooling)
        reference = st_reference(folder, TEXTS)
    with LLM(str(folder), **ENGINE) as llm:
        assert llm.engine.parts.runner.kind == "pooling"  # auto: a sentence-transformers folder
        outputs = llm.embed(TEXTS, use_tqdm=False)
    got = np.array([output.outputs.embedding for output in outputs])
    np.testing.assert_allclose(got, reference, atol=1e-5, rtol=0)
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


def test_unnormalised_mean_and_bare_decoder_architecture(tmp_path, smol_tokenizer):
    """A ``Qwen3Model`` checkpoint (no LM head) through the registry; no Normalize module."""
    folder = build_embedding_model(
        tmp_path / "m", smol_tokenizer, "MEAN", normalize=False, architectures=["Qwen3Model"]
    )
    with LLM(str(folder), **ENGINE) as llm:
        assert llm.engine.parts.runner.kind == "pooling"
        got = np.array([o.outputs.embedding for o in llm.embed(TEXTS, use_tqdm=False)])
    np.testing.assert_allclose(got, st_reference(folder, TEXTS), atol=1e-5, rtol=0)
    assert not np.allclose(np.linalg.norm(got, axis=1), 1.0)


def test_generate_runner_also_embeds_and_pooling_runner_refuses_generation(
    tiny_folder, last_folder
):
    from octavo.sampling_params import SamplingParams

    with LLM(str(tiny_folder("qwen2")), **ENGINE) as llm:
        assert llm.engine.parts.runner.kind == "generate"
        (out,) = llm.embed(["hello"], PoolingParams(normalize=False), use_tqdm=False)
        assert len(out.outputs.embedding) == 64
        (text,) = llm.generate(["hello"], SamplingParams(max_tokens=2), use_tqdm=False)
        assert len(text.outputs[0].token_ids) == 2
    with LLM(str(last_folder), **ENGINE) as llm, pytest.raises(ValueError, match="runner pooling"):
        llm.generate(["hello"], SamplingParams(max_tokens=2), use_tqdm=False)


def test_prefix_cache_and_batch_of_64_equal_one_by_one(last_folder):
    preamble = "A shared instruction that every input of this batch starts with. " * 3
    texts = [f"{preamble}Then item number {i}." for i in range(64)]
    with LLM(str(last_folder), **ENGINE) as llm:
        batched = np.array([o.outputs.embedding for o in llm.embed(texts, use_tqdm=False)])
        hits_before = llm.engine.scheduler.counters.hits
        alone = np.array([llm.embed([t], use_tqdm=False)[0].outputs.embedding for t in texts])
        assert llm.engine.scheduler.counters.hits > hits_before  # the second pass reused KV
    np.testing.assert_allclose(batched, alone, atol=1e-5, rtol=0)


def test_matryoshka_dimensions(tmp_path, smol_tokenizer):
    folder = build_embedding_model(tmp_path / "m", smol_tokenizer, "LAST", is_matryoshka=True)
    with LLM(str(folder), **ENGINE) as llm:
        (full,) = llm.embed(["hello world"], PoolingParams(normalize=False), use_tqdm=False)
        (cut,) = llm.embed(["hello world"], PoolingParams(dimensions=16), use_tqdm=False)
    head = np.array(full.outputs.embedding[:16])
    np.testing.assert_allclose(cut.outputs.embedding, head / np.linalg.norm(head), atol=1e-6)


# ----- the HTTP API --------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(last_folder):
    app = build_local_app(str(last_folder), **ENGINE)
    with ThreadedServer(app) as running:
        yield running.wait_ready()  # a test run alone must not meet the 503 of loading


def test_openai_client_float_and_base64(server, last_folder, last_reference):
    client = openai_client(server)
    reference = last_reference
    as_floats = client.embeddings.create(
        model=str(last_folder), input=TEXTS, encoding_format="float"
    )
    as_base64 = client.embeddings.create(model=str(last_folder), input=TEXTS)  # SDK: base64
    for response in (as_floats, as_base64):
        got = np.array([item.embedding for item in response.data])
        np.testing.assert_allclose(got, reference, atol=1e-5, rtol=0)
        assert [item.index for item in response.data] == list(range(len(TEXTS)))
    assert as_floats.usage.prompt_tokens == as_floats.usage.total_tokens > len(TEXTS)


def test_base64_is_little_endian_float32(server):
    body = {"input": ["hello", "world"], "encoding_format": "base64"}
    raw = httpx.post(f"{server.url}/v1/embeddings", json=body, timeout=60).json()
    floats = httpx.post(
        f"{server.url}/v1/embeddings", json={**body, "encoding_format": "float"}, timeout=60
    ).json()
    for encoded, plain in zip(raw["data"], floats["data"], strict=True):
        decoded = np.frombuffer(base64.b64decode(encoded["embedding"]), dtype="<f4")
        np.testing.assert_array_equal(decoded, np.asarray(plain["embedding"], dtype="<f4"))
    assert raw["object"] == "list" and raw["data"][0]["object"] == "embedding"


def test_token_id_inputs_equal_text_inputs(server, smol_tokenizer):
    ids = smol_tokenizer.encode("hello world")
    by_text = httpx.post(f"{server.url}/v1/embeddings", json={"input": "hello world"}, timeout=60)
    by_ids = httpx.post(f"{server.url}/v1/embeddings", json={"input": [ids, ids]}, timeout=60)
    assert by_ids.status_code == by_text.status_code == 200, (by_ids.text, by_text.text)
    assert by_ids.json()["data"][1]["embedding"] == by_text.json()["data"][0]["embedding"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": ""}, "input"),
        ({"input": []}, "input"),
        ({"input": ["ok", ""]}, "input"),
        ({"input": [[1, 2, 10**9]]}, "input"),
        ({"input": "x", "dimensions": 8}, "dimensions"),  # not a Matryoshka model
        ({"input": "x", "encoding_format": "hex"}, "encoding_format"),
        ({"input": "x", "truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
        ({"input": "word " * 600}, "input"),  # longer than max_model_len 512
        # Checked as /v1/completions checks them:
        ({"input": [True]}, "input"),  # a boolean is not a token id
        ({"input": [[1, False]]}, "input"),
        ({"input": "x", "request_id": "r" * 201}, "request_id"),  # at most 200 characters
        ({"input": "x", "request_id": ""}, "request_id"),
        ({"input": "x", "priority": 1}, "priority"),  # no priority scheduling
    ],
)
def test_bad_input_is_a_400_naming_the_field(server, body, param):
    response = httpx.post(f"{server.url}/v1/embeddings", json=body, timeout=60)
    assert response.status_code == 400, response.text
    assert param in (response.json()["error"]["param"] or "")


def test_the_input_count_is_checked_before_anything_is_tokenized(server):
    """10k strings were all tokenized before the count was checked: now the count first."""
    context = server.app.state.octavo
    calls = []
    run, limit = context.tokenizers.run, context.config.max_sequences_per_request

    async def counting_run(*args):
        calls.append(args[0])
        return await run(*args)

    context.tokenizers.run, context.config.max_sequences_per_request = counting_run, 3
    try:
        refused = httpx.post(f"{server.url}/v1/embeddings", json={"input": ["a"] * 4}, timeout=60)
        accepted = httpx.post(f"{server.url}/v1/embeddings", json={"input": ["a"] * 3}, timeout=60)
    finally:
        context.tokenizers.run, context.config.max_sequences_per_request = run, limit
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "input"
    assert "--max-sequences-per-request" in refused.json()["error"]["message"]
    assert accepted.status_code == 200, accepted.text
    assert len(calls) == 1, "only the accepted request reached the tokenizer"


def test_truncation_keeps_the_last_tokens(server):
    long = "word " * 600
    response = httpx.post(
        f"{server.url}/v1/embeddings",
        json={"input": long, "truncate_prompt_tokens": 100},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["prompt_tokens"] == 100


def test_generation_routes_refuse_a_pooling_model(server):
    response = httpx.post(f"{server.url}/v1/completions", json={"prompt": "hi"}, timeout=60)
    assert response.status_code == 400
    assert "--runner pooling" in response.json()["error"]["message"]


@pytest.mark.parametrize("layout", [{"tensor_parallel_size": 2}, {"pipeline_parallel_size": 2}])
def test_embeddings_under_tensor_and_pipeline_parallelism(last_folder, last_reference, layout):
    """Worker processes: the driver pools, the other ranks only compute their shards."""
    with LLM(str(last_folder), **ENGINE, **layout) as llm:
        got = np.array([o.outputs.embedding for o in llm.embed(TEXTS, use_tqdm=False)])
    np.testing.assert_allclose(got, last_reference, atol=1e-5, rtol=0)


def test_runner_flags_parse_as_vllm_spells_them(last_folder):
    from octavo.cli import build_parser
    from octavo.entrypoints.openai.cli import parsed_engine_args

    def engine_args(*flags: str):
        return parsed_engine_args(build_parser().parse_args(["serve", "m", *flags]))

    args = engine_args("--task", "embed", "--pooler-config", '{"pooling_type": "mean"}')
    assert (args.task, args.pooler_config) == ("embed", {"pooling_type": "MEAN"})
    assert engine_args("--runner", "pooling").runner == "pooling"
    with pytest.raises(SystemExit):  # argparse: "unknown keys ['pooling']"
        engine_args("--pooler-config", '{"pooling": "mean"}')
    with pytest.raises(ValueError, match="contradicts"):
        LLM(str(last_folder), runner="generate", task="embed", **ENGINE)


def test_pooler_config_overrides_the_sentence_transformers_defaults(last_folder):
    config = {"pooling_type": "MEAN", "normalize": False}
    with LLM(str(last_folder), pooler_config=config, **ENGINE) as llm:
        (out,) = llm.embed(["hello world"], use_tqdm=False)
        pooler = llm.engine.parts.runner.pooler
    assert (pooler.pooling_type.value, pooler.normalize) == ("MEAN", False)
    assert abs(np.linalg.norm(out.outputs.embedding) - 1.0) > 1e-3
