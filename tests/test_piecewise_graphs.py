"""Steps cut at attention (``model_executor/piecewise_graphs.py``): the recorded pieces with
eager attention between them give the eager forward's tokens.

Without a GPU the pieces are CPU tapes (``piecewise_tapes``: each piece's op calls, replayed),
cut by the same ``HoleAttention`` as the CUDA graphs are; the engine's mixed steps then
run through them. The CUDA test (GPU only) checks the default engine captures them and
matches ``--enforce-eager`` token for token.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from octavo import LLM, SamplingParams
from octavo.compilation.config import parse_compilation_config
from octavo.config import EngineArgs
from octavo.distributed.parallel_config import ParallelConfig
from octavo.engine.builder import piecewise_sizes
from octavo.model_executor import piecewise_graphs
from octavo.model_executor.piecewise_graphs import PiecewiseGraphs, cuts_cleanly
from piecewise_tapes import TapeSegments

SIZES = [8, 16, 32, 64]
ENGINE = {"dtype": "float32", "device": "cpu", "max_num_batched_tokens": 64, "max_model_len": 256}
GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)


def prompts() -> list[list[int]]:
    lengths = [5, 30, 70, 12, 41]  # one prompt longer than a step: chunks beside decodes
    return [[(7 * i + 3 * j) % 500 + 1 for j in range(n)] for i, n in enumerate(lengths)]


def pieces_for(llm: LLM) -> PiecewiseGraphs:
    runner = llm.engine.executor.worker.runner
    pieces = PiecewiseGraphs(runner.paged, SIZES, 256, TapeSegments())
    assert pieces.capture(), "the tiny Llama cuts cleanly"
    return pieces


def test_mixed_steps_through_the_pieces_give_the_eager_tokens(tiny_folder, monkeypatch):
    folder = str(tiny_folder("llama3"))
    with LLM(folder, enforce_eager=True, **ENGINE) as eager:
        expected = [o.outputs[0].token_ids for o in eager.generate(prompts(), GREEDY)]
    with LLM(folder, **ENGINE) as llm:
        runner = llm.engine.executor.worker.runner
        runner.piecewise = pieces_for(llm)
        sizes = []
        replay = runner.piecewise.run
        monkeypatch.setattr(
            runner.piecewise, "run", lambda inputs, size: sizes.append(size) or replay(inputs, size)
        )
        got = [o.outputs[0].token_ids for o in llm.generate(prompts(), GREEDY)]
    assert got == expected
    assert sizes and set(sizes) <= set(SIZES) and max(sizes) == 64  # full steps of chunks


def test_a_step_takes_the_smallest_size_that_holds_it_and_others_run_eagerly(tiny_folder):
    with LLM(str(tiny_folder("llama3")), **ENGINE) as llm:
        pieces = pieces_for(llm)

        def step(tokens: int, **extra) -> SimpleNamespace:
            fields = {"lora": None, "image_embeds": None, "token_type_ids": None}
            positions = torch.zeros(tokens, dtype=torch.long)
            return SimpleNamespace(input_ids=positions, positions=positions, **fields | extra)

        assert [pieces.size_for(step(n)) for n in (1, 8, 9, 33, 64)] == [8, 8, 16, 64, 64]
        assert pieces.size_for(step(65)) is None  # past the largest size
        assert pieces.size_for(step(4, lora=object())) is None
        assert pieces.size_for(step(4, image_embeds=object())) is None
        rows3 = SimpleNamespace(**vars(step(4)) | {"positions": torch.zeros(3, 4)})
        assert pieces.size_for(rows3) is None  # M-RoPE's three rows of positions


def test_a_replay_that_differs_from_the_forward_leaves_the_steps_eager(tiny_folder, monkeypatch):
    with LLM(str(tiny_folder("llama3")), **ENGINE) as llm:
        monkeypatch.setattr(piecewise_graphs.Hole, "run", lambda self, backend, meta, rows: None)
        runner = llm.engine.executor.worker.runner
        pieces = PiecewiseGraphs(runner.paged, SIZES, 256, TapeSegments())
        assert not pieces.capture() and not pieces.pieces


def test_models_that_read_the_step_outside_attention_are_not_cut():
    def model(**overrides) -> SimpleNamespace:
        layers = [SimpleNamespace(is_state_layer=False)] * 2
        config = SimpleNamespace(kv_latent_dim=None)
        stage = SimpleNamespace(is_first=True, is_last=True)
        fields = {"layers": layers, "config": config, "stage": stage} | overrides
        return SimpleNamespace(model=SimpleNamespace(**fields))

    assert cuts_cleanly(model()) is None
    hybrid = model(layers=[SimpleNamespace(is_state_layer=True)])
    assert "state layers" in cuts_cleanly(hybrid)
    assert "latent" in cuts_cleanly(model(config=SimpleNamespace(kv_latent_dim=512)))
    assert "encoder" in cuts_cleanly(model(is_encoder=True))
    staged = model(stage=SimpleNamespace(is_first=True, is_last=False))
    assert "pipeline" in cuts_cleanly(staged)


def test_the_modes_and_sizes_follow_vllms_compilation_config(monkeypatch):
    default = parse_compilation_config(None)
    assert default.full_decode_graphs and default.piecewise_graphs  # FULL_AND_PIECEWISE
    full = parse_compilation_config({"cudagraph_mode": "FULL"})
    assert full.cudagraph_mode == "FULL_AND_PIECEWISE"
    only = parse_compilation_config({"cudagraph_mode": "PIECEWISE"})
    assert only.piecewise_graphs and not only.full_decode_graphs
    decode = parse_compilation_config({"cudagraph_mode": "FULL_DECODE_ONLY"})
    assert decode.full_decode_graphs and not decode.piecewise_graphs
    gpu = SimpleNamespace(name="NVIDIA H200", total_memory=141 * 2**30)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: gpu)
    cuda, single = torch.device("cuda"), ParallelConfig()
    sizes = piecewise_sizes(EngineArgs(), cuda, single, False, 4096)
    assert sizes[:4] == (1, 2, 4, 8) and sizes[-1] == 512  # vLLM's ladder, at most 512
    small = EngineArgs(max_num_batched_tokens=100)
    assert piecewise_sizes(small, cuda, single, False, 4096)[-1] == 100
    assert piecewise_sizes(EngineArgs(), torch.device("cpu"), single, False, 4096) == ()
    assert piecewise_sizes(EngineArgs(enforce_eager=True), cuda, single, False, 4096) == ()
    assert piecewise_sizes(EngineArgs(), cuda, ParallelConfig(2), False, 4096) == ()
    assert piecewise_sizes(EngineArgs(compilation_config=decode), cuda, single, False, 4096) == ()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CUDA graphs)")
def test_on_a_gpu_the_default_engine_replays_pieces_with_eager_tokens(tiny_folder):
    folder = str(tiny_folder("llama3"))
    engine = {"dtype": "bfloat16", "device": "cuda", "max_num_batched_tokens": 64}
    with LLM(folder, enforce_eager=True, **engine) as eager:
        expected = [o.outputs[0].token_ids for o in eager.generate(prompts(), GREEDY)]
    with LLM(folder, cudagraph_metrics=True, disable_log_stats=False, **engine) as llm:
        runner = llm.engine.executor.worker.runner
        assert runner.piecewise is not None
        got = [o.outputs[0].token_ids for o in llm.generate(prompts(), GREEDY)]
    assert got == expected
    modes = {stat.runtime_mode for stat in runner.graph_metrics.counts}
    assert {"FULL", "PIECEWISE"} <= modes, runner.graph_metrics.report()


def test_the_checked_step_keeps_its_prompts_within_max_model_len(tiny_folder):
    with LLM(str(tiny_folder("llama3")), **ENGINE) as llm:
        paged = llm.engine.executor.worker.runner.paged
        inputs = piecewise_graphs.checking_step(100, paged, 32)
        assert inputs.meta.query_lens_list == [32, 32, 32, 2, 1, 1]
        assert max(inputs.meta.seq_lens_list) <= 32
        assert PiecewiseGraphs(paged, [8, 64], 30, TapeSegments()).capture()
