"""``python -m octavo_bench rerank`` and ``embeddings`` on tiny random BERT encoders, and the
encoder presets of ``random-model``: each command runs end to end in seconds (the figures
themselves are never a test), Octavo's scores equal sentence-transformers', and vLLM, when
it is not installed, is reported as not measured with the reason."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
from transformers import AutoTokenizer, BertConfig

from octavo_bench import cli, rerank_vllm_runner
from octavo_bench.embedding_report import EmbeddingReport, WorkloadResult
from octavo_bench.embeddings import WORDS
from octavo_bench.embeddings_vllm import record
from octavo_bench.rerank_models import ENCODER_PRESETS, build_encoder, wordpiece_vocab
from octavo_bench.rerank_vllm import VllmRepeats

TINY_BERT = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 64,
    "vocab_size": 2000,
    "max_position_embeddings": 512,
    "type_vocab_size": 2,
}


@pytest.mark.parametrize("preset", sorted(ENCODER_PRESETS))
def test_encoder_presets_are_real_bert_shapes(preset):
    config = BertConfig(**ENCODER_PRESETS[preset])
    assert (config.hidden_size, config.intermediate_size, config.vocab_size) == (384, 1536, 30522)
    vocab = wordpiece_vocab(config.vocab_size)
    assert len(vocab) == 30522 and vocab["[CLS]"] == 101 and vocab["[SEP]"] == 102


def test_rerank_scores_like_sentence_transformers_and_skips_a_missing_vllm(tmp_path, capsys):
    folder = build_encoder("cross-encoder-minilm", tmp_path / "ce", {**TINY_BERT, "num_labels": 1})
    argv = ["rerank", "--model", str(folder), "--queries", "2", "--documents", "5"]
    argv += ["--vllm-python", str(tmp_path / "no-python"), "--output-dir", str(tmp_path / "out")]
    assert cli.main(argv) == 0
    assert "not measured" in capsys.readouterr().out
    report = json.loads((tmp_path / "out" / "rerank.json").read_text())
    engines = {entry["engine"]: entry for entry in report["engines"]}
    assert list(engines) == ["octavo", "sentence-transformers", "vllm"]
    assert engines["octavo"]["median_pairs_per_s"] > 0
    assert engines["octavo"]["max_abs_diff"] < 1e-5
    assert engines["vllm"]["pairs_per_s"] == [] and "no-python" in engines["vllm"]["skipped"]


def test_rerank_refuses_empty_sizes(capsys):
    assert cli.main(["rerank", "--documents", "0"]) == 2
    assert "--documents must be at least 1" in capsys.readouterr().err


def test_embeddings_bench_runs_a_bert_sentence_transformers_folder(tmp_path):
    folder = build_encoder("bert-small", tmp_path / "bert", TINY_BERT)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert tokenizer.unk_token_id not in tokenizer(" ".join(WORDS))["input_ids"]
    argv = ["embeddings", "--model", str(folder), "--dtype", "float32", "--num-inputs", "4"]
    argv += ["--batch-size", "4", "--repeats", "1", "--output-dir", str(tmp_path / "out")]
    assert cli.main([*argv, "--vllm-python", str(tmp_path / "no-python")]) == 0
    report = json.loads((tmp_path / "out" / "embeddings.json").read_text())
    assert all(w["max_abs_diff"] < 1e-5 for w in report["workloads"])
    assert all(w["vllm_median"] is None for w in report["workloads"])
    assert any("vllm not measured" in note for note in report["notes"])


def test_vllm_embedding_figures_land_in_their_workloads():
    report = EmbeddingReport("m", "float32", 2, 1, [WorkloadResult("passages")])
    report.workloads[0].octavo_inputs_per_s = [8.0]
    runs = [("passages", ["a", "b", "c"], np.array([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]]))]
    vectors = [[[1.0, 0.0], [0.0, 1.0]], [[0.5, 0.25]]]  # two batches, one vector off
    record(report, runs, VllmRepeats([0.75], [vectors], "0.0", 1.0))
    passages = report.workloads[0]
    assert passages.vllm == 4.0 and passages.vllm_speedup == 2.0
    assert passages.vllm_max_abs_diff == 0.25


def test_vllm_runner_scores_each_query_and_embeds_each_batch():
    def output(**fields):
        return SimpleNamespace(outputs=SimpleNamespace(**fields))

    fake = SimpleNamespace(
        score=lambda query, documents, use_tqdm: [output(score=len(d)) for d in documents],
        embed=lambda batch, use_tqdm: [output(embedding=[len(t)]) for t in batch],
    )
    repeat = {"queries": ["q", "r"], "documents": [["a", "bb"], ["ccc"]]}
    assert rerank_vllm_runner.run_repeat(fake, "score", repeat) == [[1, 2], [3]]
    assert rerank_vllm_runner.run_repeat(fake, "embed", repeat) == [[[1], [2]], [[3]]]
