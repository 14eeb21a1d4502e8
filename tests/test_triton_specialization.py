"""A new batch compiles no Triton kernel again: the arguments that change from step to step
(the block table's width, slices of the step's packed inputs, the split count) are declared
unspecialised, so every step of a running engine launches variants already compiled.

Measured on an H200 (``step-profile --offline 256``, nano-vllm's shape on a 1B model): the
steps with a prefill part, run eagerly, took 82 ms each on average, the host as long as
the GPU, the signature of Triton compiling mid-step. The launches here are recorded, not
run (``triton_launches``), so the check costs no kernel time; Triton's interpreter
(conftest, without a GPU) or a GPU alike."""

from __future__ import annotations

import inspect

import pytest
import torch

from octavo.attention import triton_decode, triton_kernels
from octavo.attention.triton_backend import TritonAttention
from octavo.model_executor.layers import lora_kernels
from octavo.model_executor.layers.moe import triton_fused_moe
from octavo.model_executor.layers.quantization import triton_fp8_blocks
from octavo.model_executor.layers.quantization import triton_kernels as quant_kernels
from octavo.model_executor.step_inputs import lay_out, step_inputs
from octavo.scheduler.output import ScheduledSequence
from triton_launches import recorded_launches, unspecialized

BLOCK_SIZE, HEADS, KV_HEADS, HEAD_DIM = 16, 4, 2, 16
# each step: (tokens already cached, new tokens) per sequence, prompt chunks first
STEPS = [
    [(0, 20)],
    [(0, 7), (40, 1), (9, 1)],
    [(16, 33), (0, 5), (100, 1), (3, 1), (250, 1)],
    [(5, 1)],
    [(31, 1), (64, 1), (200, 1), (17, 1), (90, 1), (130, 1), (7, 1)],
    [(0, 48), (300, 1), (2, 1), (65, 1), (80, 1)],
    [(0, 3), (47, 1), (33, 1)],
    [(120, 1), (121, 1)],
    [(1100, 1), (20, 1)],  # 17 splits on an H200
    [(2100, 1)],  # 32 splits: the same merge kernel, its count divisible by 16
]


def scheduled_step(shape: list[tuple[int, int]]) -> tuple[list[ScheduledSequence], int]:
    scheduled, next_block = [], 1
    for seq_id, (cached, new) in enumerate(shape):
        blocks = -(-(cached + new) // BLOCK_SIZE)
        block_ids = list(range(next_block, next_block + blocks))
        next_block += blocks
        tokens = [(seq_id * 31 + i) % 97 for i in range(new)]
        scheduled.append(ScheduledSequence(seq_id, tokens, cached, block_ids, sample=True))
    return scheduled, sum(1 for _, new in shape if new > 1)


def run_steps() -> None:
    """Each step through the Triton backend as the model runs it: q/k/v strided views of
    one fused projection, the metadata from the runner's own layout code."""
    cache = torch.zeros(2, 256, BLOCK_SIZE, KV_HEADS, HEAD_DIM)
    backend = TritonAttention()
    for shape in STEPS:
        scheduled, num_prefills = scheduled_step(shape)
        inputs = step_inputs(lay_out(scheduled, BLOCK_SIZE), num_prefills, torch.device("cpu"))
        tokens = inputs.input_ids.shape[0]
        fused = torch.randn(tokens, (HEADS + 2 * KV_HEADS) * HEAD_DIM)
        sizes = [HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM]
        q, k, v = (t.view(tokens, -1, HEAD_DIM) for t in fused.split(sizes, dim=1))
        backend.forward(q, k, v, cache, inputs.meta, HEAD_DIM**-0.5)


def test_steps_of_any_batch_launch_one_variant_per_compile_option(monkeypatch):
    monkeypatch.setattr(triton_decode, "sm_count", lambda device: 132)  # an H200's split counts
    with recorded_launches(monkeypatch) as recorder:
        run_steps()
    kernels = {launch.name for launch in recorder.launches}
    assert kernels == {
        "_store_kv_kernel",
        "_prefill_kernel",
        "_decode_kernel",
        "_split_kernel",
        "_merge_kernel",
    }
    declared = recorder.variants()
    assert all(len(found) == 1 for found in declared.values()), declared
    undeclared = recorder.variants(declared=False)  # the steps do vary what is declared
    assert sum(len(found) for found in undeclared.values()) > len(declared)
    for name in ("_prefill_kernel", "_decode_kernel", "_split_kernel", "_merge_kernel"):
        assert any(len(v) > 1 for k, v in undeclared.items() if k[0] == name), name


DECLARING_MODULES = [
    triton_kernels,
    triton_decode,
    triton_fused_moe,
    quant_kernels,
    triton_fp8_blocks,
    lora_kernels,
]


@pytest.mark.parametrize("module", DECLARING_MODULES, ids=lambda m: m.__name__.split(".")[-1])
def test_every_declared_name_is_a_parameter_of_its_kernel(module):
    """Triton ignores a name that is not a parameter: a typo would compile per step again."""
    checked = 0
    for kernel in vars(module).values():
        if not hasattr(kernel, "fn") or not callable(kernel.fn):
            continue
        parameters = set(inspect.signature(kernel.fn).parameters)
        for kind in ("do_not_specialize", "do_not_specialize_on_alignment"):
            names = unspecialized(kernel, kind)
            assert names <= parameters, (kernel.fn.__name__, names - parameters)
            checked += len(names)
    assert checked > 0
