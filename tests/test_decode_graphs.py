"""Decode steps through persistent buffers and recorded graphs (``compilation/``).

On CPU the buffers, the padding rows and the dispatch are checked against eager steps token
for token with graphs "recorded" by re-running the forward on the persistent buffers, and
with the CPU's own recorded graphs (``cpu_graphs``); on a GPU the same is checked with real
CUDA graphs.
"""

from __future__ import annotations

import pytest
import torch

from octavo import LLM, SamplingParams
from octavo.compilation.config import (
    CompilationConfig,
    cpu_graphs_at_first_use,
    parse_compilation_config,
)
from octavo.config import EngineArgs
from octavo.distributed.parallel_config import ParallelConfig
from octavo.engine.builder import graph_sizes
from octavo.model_executor.cpu_graphs import CpuGraphRecorder
from octavo.model_executor.decode_graphs import DecodeGraphs

PROMPTS = [[11, 12, 13], [21, 22, 23, 24, 25, 26, 27], [31, 32], [41, 42, 43, 44, 45]]
MAX_TOKENS = [9, 4, 12, 6]  # sequences finish at different steps: the batch shrinks


class RerunRecorder:
    """A CPU stand-in for CUDA graph capture: each replay re-runs the recorded forward,
    which reads only the persistent buffers, as a graph would."""

    name = "rerun graphs"
    checks_replays = False
    recorded_bytes = 0
    shares_outputs = False
    arena_generation = 0

    def __init__(self) -> None:
        self.recorded = 0
        self.replays = 0

    def record(self, forward):
        self.recorded += 1

        def replay() -> torch.Tensor:
            self.replays += 1
            return forward()

        return replay


def test_the_default_sizes_follow_vllms_ladder_up_to_the_decode_rows():
    config = CompilationConfig()
    assert config.capture_sizes(256)[:6] == [1, 2, 4, 8, 16, 24]
    assert config.capture_sizes(256)[-2:] == [248, 256]
    assert config.capture_sizes(300)[-4:] == [256, 272, 288, 300]  # the largest batch too
    assert config.capture_sizes(10_000)[-1] == 512
    assert config.capture_sizes(3) == [1, 2, 3]
    explicit = CompilationConfig(cudagraph_capture_sizes=(8, 1, 4, 4))
    assert explicit.capture_sizes(256) == [1, 4, 8]
    # on CPU steps of 16 past 16, by default up to 64 rows
    assert config.capture_sizes(256, "cpu") == [1, 2, 4, 8, 16, 32, 48, 64]
    assert config.capture_sizes(44, "cpu") == [1, 2, 4, 8, 16, 32, 44]
    assert CompilationConfig(max_cudagraph_capture_size=128).capture_sizes(256, "cpu")[-1] == 128
    assert explicit.capture_sizes(256, "cpu") == [1, 4, 8]


def test_the_config_takes_vllms_spellings_and_refuses_unknown_keys():
    assert not parse_compilation_config("0").uses_graphs
    assert parse_compilation_config('{"cudagraph_mode": "none"}').uses_graphs is False
    assert parse_compilation_config({"cudagraph_mode": "FULL_AND_PIECEWISE"}).uses_graphs
    with pytest.raises(ValueError, match="unsupported keys splitting_ops"):
        parse_compilation_config('{"splitting_ops": []}')
    with pytest.raises(ValueError, match="cudagraph_capture_sizes must be positive"):
        parse_compilation_config({"cudagraph_capture_sizes": [0]})
    with pytest.raises(ValueError, match="level must be 0-3"):
        parse_compilation_config("7")


def test_when_cpu_graphs_are_recorded_is_read_from_the_environment(monkeypatch):
    monkeypatch.setenv("OCTAVO_CPU_GRAPHS", "start-up")
    assert cpu_graphs_at_first_use() is False
    monkeypatch.setenv("OCTAVO_CPU_GRAPHS", "first-use")
    assert cpu_graphs_at_first_use() is True
    monkeypatch.setenv("OCTAVO_CPU_GRAPHS", "lazy")
    with pytest.raises(ValueError, match=r"\$OCTAVO_CPU_GRAPHS is 'lazy': one of start-up, first"):
        cpu_graphs_at_first_use()


def test_graphs_are_captured_only_on_a_single_rank_without_eager_or_lora():
    cuda, single = torch.device("cuda"), ParallelConfig()
    args = EngineArgs(max_num_seqs=16)
    assert graph_sizes(args, cuda, single, None) == (1, 2, 4, 8, 16)
    assert graph_sizes(args, torch.device("cpu"), single, None) == (1, 2, 4, 8, 16)
    assert graph_sizes(EngineArgs(max_num_seqs=48), torch.device("cpu"), single, None)[-1] == 48
    assert graph_sizes(EngineArgs(enforce_eager=True), cuda, single, None) == ()
    assert graph_sizes(EngineArgs(compilation_config=0), cuda, single, None) == ()
    assert graph_sizes(EngineArgs(enable_lora=True), cuda, single, None) == ()
    assert graph_sizes(args, torch.device("cpu"), single, None, compiled_layers=True) == ()
    assert graph_sizes(args, cuda, ParallelConfig(tensor_parallel_size=2), None) == ()


def test_interactivity_takes_a_graph_for_every_batch_size_up_to_32():
    cuda, single = torch.device("cuda"), ParallelConfig()
    interactive = EngineArgs(max_num_seqs=64, performance_mode="interactivity")
    assert graph_sizes(interactive, cuda, single, None) == (*range(1, 33), 40, 48, 56, 64)
    cpu_sizes = graph_sizes(interactive, torch.device("cpu"), single, None)
    assert cpu_sizes == (*range(1, 33), 48, 64)
    balanced = graph_sizes(EngineArgs(max_num_seqs=64), cuda, single, None)
    assert balanced == (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64)


def _generate(llm: LLM, prompts: list[list[int]] = PROMPTS, **params) -> list[list[int]]:
    outputs = llm.generate(
        prompts,
        [
            SamplingParams(**{"temperature": 0, **params}, max_tokens=n, ignore_eos=True)
            for n in MAX_TOKENS[: len(prompts)]
        ],
        use_tqdm=False,
    )
    return [list(out.outputs[0].token_ids) for out in outputs]


@pytest.fixture(scope="module")
def tiny_llm(tiny_folder):
    llm = LLM(
        str(tiny_folder("llama3")),
        device="cpu",
        dtype="float32",
        max_model_len=256,
        enforce_eager=True,
    )
    assert llm.engine.executor.worker.runner.graphs is None
    yield llm
    llm.shutdown()


def test_padded_decode_steps_through_the_buffers_equal_eager_steps(tiny_llm):
    eager = _generate(tiny_llm)
    runner = tiny_llm.engine.executor.worker.runner
    recorder = RerunRecorder()
    graphs = DecodeGraphs(runner.paged, [1, 2, 8], 256, recorder)
    graphs.capture()
    runner.graphs = graphs
    try:
        replayed = _generate(tiny_llm)
        sampled = _generate(tiny_llm, seed=7, temperature=0.8, top_p=0.9)
        runner.graphs = None
        assert sampled == _generate(tiny_llm, seed=7, temperature=0.8, top_p=0.9)
    finally:
        runner.graphs = None
    assert recorder.recorded == 3
    assert recorder.replays >= 2 * max(MAX_TOKENS) - 2  # every decode step went through them
    assert replayed == eager


def test_a_step_that_does_not_fit_runs_eagerly(tiny_llm):
    runner = tiny_llm.engine.executor.worker.runner
    recorder = RerunRecorder()
    graphs = DecodeGraphs(runner.paged, [1, 2], 256, recorder)
    graphs.capture()
    runner.graphs = graphs
    try:
        replayed = _generate(tiny_llm)  # 4 sequences: larger than the largest graph
        scored = tiny_llm.generate(
            PROMPTS[:1], SamplingParams(max_tokens=3, prompt_logprobs=1), use_tqdm=False
        )
    finally:
        runner.graphs = None
    assert replayed[2][-1] == _generate(tiny_llm)[2][-1]
    assert recorder.replays > 0  # the last two sequences decode alone at the end
    assert scored[0].prompt_logprobs is not None


@pytest.mark.parametrize("when", ["start-up", "first-use"])
def test_cpu_graphs_are_captured_by_default_and_give_the_eager_tokens(
    tiny_folder, tiny_llm, monkeypatch, when
):
    """Greedy and seeded sampling, as the batch shrinks from 4 rows (padded to 4) to 1;
    recorded at start-up (the default) or each size at its first use, between the steps
    of sequences whose cache the recording must not touch."""
    eager = [_generate(tiny_llm), _generate(tiny_llm, seed=7, temperature=0.8, top_p=0.9)]
    monkeypatch.setenv("OCTAVO_CPU_GRAPHS", when)
    graphed = LLM(
        str(tiny_folder("llama3")),
        device="cpu",
        dtype="float32",
        max_model_len=256,
        max_num_seqs=8,
        cudagraph_metrics=True,
        disable_log_stats=False,
    )
    try:
        graphs = graphed.engine.executor.worker.runner.graphs
        assert graphs is not None
        if when == "start-up":
            assert sorted(graphs.replays) == [1, 2, 4, 8] and graphs.capture_bytes > 0
        else:
            assert graphs.replays == {} and graphs.capture_bytes == 0
        sizes, run = [], graphs.run
        graphs.run = lambda inputs, size: sizes.append(size) or run(inputs, size)
        replayed = [_generate(graphed), _generate(graphed, seed=7, temperature=0.8, top_p=0.9)]
        metrics = graphed.engine.executor.worker.runner.graph_metrics
    finally:
        graphed.shutdown()
    assert replayed == eager
    assert {1, 2, 4} <= set(sizes) and len(sizes) >= 2 * (max(MAX_TOKENS) - 1)
    assert {1, 2, 4} <= set(graphs.replays) and graphs.capture_bytes > 0
    # --cudagraph-metrics: 3 decoding rows replayed the graph of 4, the prefill ran eagerly
    assert metrics.settings == "decode graphs (FULL) of 1, 2, 4, 8 rows"
    seen = {(s.unpadded_tokens, s.padded_tokens, s.runtime_mode) for s in metrics.counts}
    assert {(4, 4, "FULL"), (3, 4, "FULL"), (1, 1, "FULL"), (17, 17, "NONE")} <= seen
    assert sum(metrics.counts.values()) == len(sizes) + 2  # one eager prefill per generate


def test_a_recording_that_needs_a_larger_arena_has_the_others_recorded_again(
    tiny_folder, tiny_llm, monkeypatch
):
    """At first use the sizes come in any order: one row, then four. The four rows' larger
    arena replaces the one row's, whose graph is recorded again when it is next used; the
    graphs keep one arena."""
    one_then_four = [_generate(tiny_llm, prompts=PROMPTS[:1]), _generate(tiny_llm)]
    monkeypatch.setenv("OCTAVO_CPU_GRAPHS", "first-use")
    graphed = LLM(
        str(tiny_folder("llama3")), device="cpu", dtype="float32", max_model_len=256, max_num_seqs=8
    )
    try:
        graphs = graphed.engine.executor.worker.runner.graphs
        first = _generate(graphed, prompts=PROMPTS[:1])
        assert sorted(graphs.replays) == [1]
        recorder, arena = graphs.recorder, graphs.recorder.arena.nbytes()
        after_four = [first, _generate(graphed)]
        assert (
            recorder.arena.nbytes() > arena and recorder.recorded_bytes == recorder.arena.nbytes()
        )
        assert set(graphs.generations.values()) == {recorder.arena_generation}
        assert {1, 2, 4} <= set(graphs.replays)  # 1 again as the batch shrank to one row
    finally:
        graphed.shutdown()
    assert after_four == one_then_four


def _reads_ids_on_the_host(embed):
    """An embedding that scales by how many distinct ids the step has, read with tolist:
    past the dispatcher, so a recording cannot see it."""

    def forward(input_ids, image_embeds):
        return embed(input_ids, image_embeds) * len(set(input_ids.tolist()))

    return forward


def _reads_a_value_with_item(embed):
    def forward(input_ids, image_embeds):
        hidden = embed(input_ids, image_embeds)
        return hidden * (1.0 + hidden.abs().max().item())

    return forward


@pytest.mark.parametrize("wrap", [_reads_ids_on_the_host, _reads_a_value_with_item])
def test_a_forward_that_reads_values_on_the_host_leaves_the_steps_eager(tiny_llm, wrap):
    model = tiny_llm.engine.executor.worker.runner.paged.model
    embed = model.embed
    model.embed = wrap(embed)
    try:
        graphs = DecodeGraphs(
            tiny_llm.engine.executor.worker.runner.paged, [1, 2], 256, CpuGraphRecorder()
        )
        assert graphs.capture() is False
    finally:
        del model.embed
    assert graphs.replays == {}


def test_a_size_that_cannot_be_recorded_at_first_use_leaves_the_steps_eager(tiny_llm):
    """The same refusal mid-run: that step and every later one run eagerly, same tokens."""
    runner = tiny_llm.engine.executor.worker.runner
    graphs = DecodeGraphs(runner.paged, [1, 2, 4], 256, CpuGraphRecorder(), at_first_use=True)
    assert graphs.capture() is True and graphs.replays == {}
    model = runner.paged.model
    model.embed = _reads_ids_on_the_host(model.embed)
    try:
        eager = _generate(tiny_llm)
        runner.graphs = graphs
        replayed = _generate(tiny_llm)
    finally:
        del model.embed
        runner.graphs = None
    assert graphs.off and graphs.replays == {}
    assert replayed == eager


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")
def test_cuda_graphs_give_the_eager_tokens_on_a_gpu(tiny_folder):
    folder = str(tiny_folder("llama3"))
    common = dict(
        device="cuda",
        dtype="float32",  # eager and graphed steps may split decode attention differently:
        # float32 keeps their rounding far below any logit gap of the random model
        max_model_len=256,
        max_num_seqs=8,
        gpu_memory_utilization=0.3,
    )
    eager = LLM(folder, enforce_eager=True, **common)
    expected = _generate(eager)
    assert eager.engine.executor.worker.runner.graphs is None
    eager_blocks = len(eager.engine.parts.pool.blocks)
    eager.shutdown()
    del eager
    torch.cuda.empty_cache()
    graphed = LLM(folder, **common)
    graphs = graphed.engine.executor.worker.runner.graphs
    assert graphs is not None and sorted(graphs.replays) == [1, 2, 4, 8]
    assert _generate(graphed) == expected
    # the graphs' memory pool was counted before the KV cache was sized
    assert len(graphed.engine.parts.pool.blocks) < eager_blocks
    graphed.shutdown()
