"""The kernel warm-up (``worker/kernel_warm_up.py``) compiles every Triton variant a serving
step can launch, so none compiles mid-serving.

Without a GPU the check is on the launches themselves: the warm-up's dummy steps and a
random workload of mixed steps run through a tiny model with the Triton attention backend,
their launches recorded, not run (``triton_launches``: Triton's own specialisation key and
compile options), and every variant the workload launches must be one the warm-up
launched. The GEMMs whose row tile follows the step's tokens (quantized, fp8 blocks, MoE)
are checked on their tile choosers. With a GPU an engine starts, runs a mixed workload, and
Triton's caches must hold no kernel more than they held after start-up.
"""

from __future__ import annotations

import random

import pytest
import torch

from octavo import LLM, SamplingParams
from octavo.attention import triton_decode
from octavo.attention.backend import select_backend
from octavo.attention.triton_backend import TritonAttention
from octavo.kv_cache.cache_tensors import allocate_kv_caches
from octavo.model_executor.dummy_steps import scheduled
from octavo.model_executor.layers.moe import triton_fused_moe
from octavo.model_executor.layers.quantization import triton_fp8_blocks
from octavo.model_executor.layers.quantization import triton_kernels as quant_kernels
from octavo.model_executor.paged_model import PagedModel
from octavo.model_executor.step_inputs import lay_out, step_inputs
from octavo.scheduler.output import ScheduledSequence
from octavo.worker.kernel_warm_up import (
    StepLimits,
    decode_steps,
    powers_of_two_up_to,
    prefill_steps,
    run_step,
    warm_up_kernels,
    warm_up_steps,
)
from triton_launches import recorded_launches

CPU = torch.device("cpu")
LIMITS = StepLimits(max_tokens=256, max_model_len=2048, block_size=16)
MAX_SEQS = 48
H200_SMS = 132  # an H200's split counts


def test_token_counts_are_the_powers_of_two_then_the_limit():
    assert powers_of_two_up_to(0) == []
    assert powers_of_two_up_to(1) == [1]
    assert powers_of_two_up_to(16) == [1, 2, 4, 8, 16]
    assert powers_of_two_up_to(100) == [1, 2, 4, 8, 16, 32, 64, 100]


def test_prefills_spend_up_to_the_budget_and_decodes_reach_the_longest_table():
    limits = StepLimits(max_tokens=300, max_model_len=128, block_size=16)
    prefills = [step.sequences for step in prefill_steps(limits)]
    assert prefills[:3] == [((0, 1),), ((0, 2),), ((0, 4),)]
    assert prefills[-2] == ((0, 128), (0, 128))  # 256 tokens: no prompt past max_model_len
    assert prefills[-1] == ((0, 128), (0, 128), (0, 44))
    decodes = [step.sequences for step in decode_steps(limits)]
    assert decodes == [((15, 1),), ((31, 1),), ((63, 1),), ((127, 1),)]
    odd = StepLimits(max_tokens=8, max_model_len=100, block_size=16)
    assert decode_steps(odd)[-1].sequences == ((99, 1),)  # 7 blocks wide, position 99
    step = warm_up_steps(odd)[-1]
    (sequence,) = scheduled(step, 16, num_groups=2)
    assert sequence.block_ids == [1] * 7 and sequence.group_block_ids == ([1] * 7, [1] * 7)


def random_step(rng: random.Random) -> list[tuple[int, int]]:
    """(cached, new) per sequence of a step the scheduler could make: prefill chunks (cache
    hits and continuations included), then decoding rows, within the budget and limits."""
    shape, budget = [], LIMITS.max_tokens
    for _ in range(rng.randint(0, 3)):
        if budget < 2:
            break
        new = rng.randint(2, min(budget, 300))
        shape.append((rng.randint(0, LIMITS.max_model_len - new), new))
        budget -= new
    rows = rng.randint(0 if shape else 1, min(budget, MAX_SEQS - len(shape)))
    shape += [(rng.randint(0, LIMITS.max_model_len - 1), 1) for _ in range(rows)]
    return shape


def workload_sequences(shape: list[tuple[int, int]], num_blocks: int) -> list[ScheduledSequence]:
    """Each sequence on blocks of its own (cycling through the cache: nothing runs)."""
    sequences, next_block = [], 0
    for seq_id, (cached, new) in enumerate(shape):
        count = -(-(cached + new) // LIMITS.block_size)
        blocks = [1 + (next_block + i) % (num_blocks - 1) for i in range(count)]
        next_block += count
        tokens = [(seq_id * 7 + i) % 50 for i in range(new)]
        sequences.append(ScheduledSequence(seq_id, tokens, cached, blocks, sample=True))
    return sequences


@pytest.fixture(scope="module")
def triton_model(tiny_folder):
    """The tiny Llama's model with its cache and the Triton attention backend (on CPU)."""
    folder, memory = str(tiny_folder("llama3")), 8 << 20
    llm = LLM(folder, dtype="float32", max_model_len=2048, kv_cache_memory=memory, device="cpu")
    worker = llm.engine.executor.worker
    caches = allocate_kv_caches(worker.cache_shape, 64, LIMITS.block_size, torch.float32, CPU)
    yield PagedModel(worker.model, caches, LIMITS.block_size, TritonAttention(), CPU)
    llm.shutdown()


def launched_variants(recorder) -> set[tuple]:
    return {(launch.compile_options(), launch.specialization()) for launch in recorder.launches}


def test_a_random_workload_launches_only_variants_the_warm_up_launched(triton_model, monkeypatch):
    monkeypatch.setattr(triton_decode, "sm_count", lambda device: H200_SMS)
    with recorded_launches(monkeypatch) as warm:
        assert warm_up_kernels(triton_model, LIMITS) == len(warm_up_steps(LIMITS))
    rng = random.Random(7)
    with recorded_launches(monkeypatch) as serving:
        for _ in range(40):
            shape = random_step(rng)
            sequences = workload_sequences(shape, 64)
            prefills = sum(1 for _, new in shape if new > 1)
            inputs = step_inputs(lay_out(sequences, LIMITS.block_size), prefills, CPU)
            with torch.inference_mode():
                triton_model.forward(inputs)
    compiled, needed = launched_variants(warm), launched_variants(serving)
    assert needed <= compiled, sorted(needed - compiled, key=str)
    options = {key[0] for key in compiled}
    tiles = {dict(o[1])["BLOCK_M"] for o in options if o[0] == "_prefill_kernel"}
    splits = {dict(o[1])["SPLITS_P2"] for o in options if o[0] == "_merge_kernel"}
    assert tiles == {16, 32, 64} and splits == {2, 4, 8, 16, 32}
    assert any(o[0] == "_decode_kernel" for o in options)  # contexts too short to split


TILE_CHOOSERS = {
    "int4/int8 GEMMs": quant_kernels._tiles,
    "fp8 block GEMM": triton_fp8_blocks._tiles,
    "MoE (top-2 of 8)": lambda tokens: triton_fused_moe.choose_tiles(2 * tokens, 8),
}


@pytest.mark.parametrize("choose", TILE_CHOOSERS.values(), ids=TILE_CHOOSERS.keys())
def test_the_warm_up_token_counts_reach_every_row_tile(choose):
    """Tiles chosen from the step's tokens: those of every count up to the budget are
    among those of the warm-up steps' counts (each a prefill step's or a decode row)."""
    counts = {sum(new for _, new in step.sequences) for step in warm_up_steps(LIMITS)}
    reached = {choose(tokens) for tokens in counts}
    assert {choose(tokens) for tokens in range(1, LIMITS.max_tokens + 1)} <= reached
    assert len(reached) > 1


def test_dummy_steps_run_through_the_cpu_model_and_give_logits(triton_model):
    backend = select_backend(CPU, torch.float32)  # the CPU engine's own attention
    model = PagedModel(triton_model.model, triton_model.kv_caches, 16, backend, CPU)
    small = StepLimits(max_tokens=40, max_model_len=128, block_size=16)
    for step in warm_up_steps(small):
        logits = run_step(model, step)
        assert logits.shape[0] == len(step.sequences) and torch.isfinite(logits).all()


def compiled_kernel_count() -> int:
    """Kernels Triton holds compiled for every JIT function of Octavo's modules."""
    import sys

    from triton.runtime.jit import JITFunction

    count = 0
    for name, module in list(sys.modules.items()):
        if not name.startswith("octavo."):
            continue
        for value in vars(module).values():
            if isinstance(value, JITFunction):
                count += sum(len(entry[0]) for entry in value.device_caches.values())
    return count


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (Triton compiles)")
def test_on_a_gpu_serving_compiles_nothing_after_start_up(tiny_folder):
    engine = {"max_model_len": 2048, "max_num_batched_tokens": 512, "max_num_seqs": 32}
    with LLM(str(tiny_folder("llama3")), dtype="bfloat16", device="cuda", **engine) as llm:
        after_start = compiled_kernel_count()
        assert after_start > 0
        rng = random.Random(3)
        prompts = [[rng.randrange(1000) for _ in range(rng.randint(3, 1500))] for _ in range(24)]
        prompts += [[*prompts[0][:700], 5, 6, 7]]  # a prefix-cache hit
        sampling = [
            SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True),
            SamplingParams(temperature=0.8, top_p=0.9, top_k=40, max_tokens=40, ignore_eos=True),
        ]
        llm.generate(prompts, [sampling[i % 2] for i in range(len(prompts))], use_tqdm=False)
        assert compiled_kernel_count() == after_start
