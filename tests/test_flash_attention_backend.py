"""``--attention-backend FLASH_ATTN``: torch's FlashAttention-2 over the paged cache.

FA2 runs on CUDA GPUs only. Here (no GPU) ``varlen_attn`` is replaced by a dense reference
of what torch documents it to compute (per sequence: its queries over its first
``seqused_k`` keys read through its block-table row, causal from the bottom right, grouped
heads), which checks every argument the backend builds from a step's metadata against the
torch backend on a mixed step; the store runs the Triton kernel under TRITON_INTERPRET. On a
GPU the last tests run the kernel itself against the Triton backend and the engine with and
without CUDA graphs (``tests/flash_reference.py`` holds the stand-in).
"""

from __future__ import annotations

import pytest
import torch

from flash_reference import dense_varlen
from octavo.attention import flash_backend
from octavo.attention.backend import TorchAttention, check_backend, select_backend
from octavo.attention.flash_backend import FlashAttention, paged_varlen_available
from octavo.attention.options import AttentionOptions
from octavo.config import EngineArgs
from octavo.model_executor.step_inputs import lay_out, step_inputs
from octavo.scheduler.output import ScheduledSequence

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 4, 2, 16, 256
MAX_POSITIONS = 2048
CPU = torch.device("cpu")
NO_GPU = "needs a CUDA GPU of sm_80 or newer and torch 2.13+ (FlashAttention-2 has no CPU build)"
HAS_FLASH_GPU = (
    torch.cuda.is_available()
    and torch.cuda.get_device_capability() >= (8, 0)
    and paged_varlen_available()
)


def mixed_step(dtype: torch.dtype, device: torch.device = CPU):
    """Two prefill chunks (a fresh prompt; 30 tokens after a 270-token prefix) and two
    decodes (contexts 5 and 513): query, key, value, a random cache in blocks of 256, meta."""
    scheduled = [
        ScheduledSequence(0, [0] * 20, 0, [1], True),
        ScheduledSequence(1, [0] * 30, 270, [2, 3], True),
        ScheduledSequence(2, [0], 4, [4], True),
        ScheduledSequence(3, [0], 512, [5, 6, 7], True),
    ]
    meta = step_inputs(lay_out(scheduled, BLOCK), 2, device).meta
    generator = torch.Generator().manual_seed(0)
    tokens = 20 + 30 + 2
    shapes = [(tokens, HEADS, HEAD_DIM), *[(tokens, KV_HEADS, HEAD_DIM)] * 2]
    shapes.append((2, 8, BLOCK, KV_HEADS, HEAD_DIM))
    query, key, value, cache = (
        torch.randn(shape, generator=generator).to(device=device, dtype=dtype) for shape in shapes
    )
    return query, key, value, cache, meta


@pytest.mark.parametrize("window", [None, 7, 300], ids=["plain", "window-7", "window-300"])
def test_one_launch_equals_the_torch_backend_on_a_mixed_step(monkeypatch, window):
    """Plain layers, and sliding-window layers (a window inside one chunk, and one reaching
    back past the 270-token prefix and the 256-token page) with FA2's ``window_size``."""
    calls = []

    def fake(*args, **kw):
        calls.append((args, kw))
        assert args[6] == MAX_POSITIONS  # the model's longest context, every step
        return dense_varlen(*args, **kw)

    monkeypatch.setattr("torch.nn.attention.varlen.varlen_attn", fake)
    options = AttentionOptions(sliding_window=window)
    query, key, value, cache, meta = mixed_step(torch.float32)
    expected_cache = cache.clone()
    expected = TorchAttention().forward(
        query, key, value, expected_cache, meta, 0.25, options=options
    )
    flash = select_backend(torch.device("cpu"), torch.float32, "FLASH_ATTN", MAX_POSITIONS)
    assert isinstance(flash, FlashAttention)
    got = flash.forward(query, key, value, cache, meta, 0.25, options=options)
    assert len(calls) == 1  # every sequence in one launch
    assert calls[0][1]["window_size"] == ((-1, 0) if window is None else (window - 1, 0))
    torch.testing.assert_close(cache, expected_cache, rtol=0, atol=0)  # the same store
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    flash.forward(query, key, value, cache, meta, 0.25, options=options)  # the next layer
    assert calls[1][0][4] is calls[0][0][4]  # reuses the step's key offsets


@pytest.mark.parametrize(
    "options",
    [
        AttentionOptions(soft_cap=5.0),
        AttentionOptions(sinks=torch.linspace(-1.0, 1.0, HEADS)),
        AttentionOptions(chunk_size=16),
        AttentionOptions(sliding_window=7, soft_cap=5.0),
    ],
    ids=["soft-cap", "sinks", "chunked", "window-and-soft-cap"],
)
def test_layers_fa2_does_not_cover_keep_the_triton_kernels(monkeypatch, options):
    monkeypatch.setattr("torch.nn.attention.varlen.varlen_attn", pytest.fail)
    query, key, value, cache, meta = mixed_step(torch.float32)
    expected_cache = cache.clone()
    expected = TorchAttention().forward(
        query, key, value, expected_cache, meta, 0.25, options=options
    )
    flash = FlashAttention(MAX_POSITIONS)
    got = flash.forward(query, key, value, cache, meta, 0.25, options=options)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_what_fa2_covers():
    query, _, _, cache, meta = mixed_step(torch.float32)
    flash = FlashAttention(MAX_POSITIONS)
    small_pages = cache.view(2, 16, 128, KV_HEADS, HEAD_DIM)
    assert not flash.covers(query, small_pages, meta, AttentionOptions())
    assert flash.covers(query, cache, meta, AttentionOptions())  # plain, not the identity
    assert flash.covers(query, cache, meta, AttentionOptions(sliding_window=7))
    both_ways = AttentionOptions(sliding_window=7, window_both_ways=True)
    assert not flash.covers(query, cache, meta, both_ways)
    odd_heads = torch.zeros(2, HEADS, 12)
    assert not flash.covers(odd_heads, cache, meta, AttentionOptions())
    assert not flash.covers(query, cache.to(torch.float8_e4m3fn), meta, AttentionOptions())


def test_the_backend_is_refused_where_it_cannot_run(monkeypatch):
    bf16 = torch.bfloat16
    with pytest.raises(ValueError, match="CUDA GPUs only"):
        check_backend("FLASH_ATTN", torch.device("cpu"), 256, bf16)
    with pytest.raises(ValueError, match="TRITON_ATTN runs on CUDA GPUs only"):
        check_backend("TRITON_ATTN", torch.device("cpu"), 16, bf16)
    check_backend("auto", torch.device("cpu"), 16, torch.float32)
    check_backend("CPU_ATTN", torch.device("cpu"), 16, torch.float32)  # auto's own on a CPU
    cuda = torch.device("cuda")
    with pytest.raises(ValueError, match="CPU_ATTN runs on CPUs only"):
        check_backend("CPU_ATTN", cuda, 16, bf16)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    with pytest.raises(ValueError, match="Ampere or newer"):
        check_backend("FLASH_ATTN", cuda, 256, bf16)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    with pytest.raises(ValueError, match="add --block-size 256"):
        check_backend("FLASH_ATTN", cuda, 16, bf16)
    with pytest.raises(ValueError, match="bfloat16 or float16"):
        check_backend("FLASH_ATTN", cuda, 256, torch.float32)
    check_backend("FLASH_ATTN", cuda, 512 // 2, bf16)
    monkeypatch.setattr(flash_backend, "paged_varlen_available", lambda: False)
    with pytest.raises(ValueError, match=r"needs torch 2\.13 or newer"):
        check_backend("FLASH_ATTN", cuda, 256, bf16)


def test_the_flag_takes_vllms_spelling():
    from octavo.cli import build_parser
    from octavo.entrypoints.openai.cli import parsed_engine_args

    flags = ["serve", "m", "--attention-backend", "flash_attn", "--block-size", "256"]
    args = parsed_engine_args(build_parser().parse_args(flags))
    assert (args.attention_backend, args.block_size) == ("FLASH_ATTN", 256)
    with pytest.raises(ValueError, match="attention_backend must be one of"):
        EngineArgs(model="m", attention_backend="FLASHINFER").validate()


@pytest.mark.skipif(not HAS_FLASH_GPU, reason=NO_GPU)
@pytest.mark.parametrize("window", [None, 7, 300], ids=["plain", "window-7", "window-300"])
def test_the_kernel_matches_the_triton_backend_on_the_gpu(window):
    from octavo.attention.triton_backend import TritonAttention

    options = AttentionOptions(sliding_window=window)
    query, key, value, cache, meta = mixed_step(torch.bfloat16, torch.device("cuda"))
    triton = TritonAttention()
    expected = triton.forward(query, key, value, cache.clone(), meta, 0.25, options=options)
    flash = FlashAttention(MAX_POSITIONS)
    got = flash.forward(query, key, value, cache, meta, 0.25, options=options)
    torch.testing.assert_close(got.float(), expected.float(), rtol=3e-2, atol=3e-2)


@pytest.mark.skipif(not HAS_FLASH_GPU, reason=NO_GPU)
@pytest.mark.parametrize("model", ["llama3", "mistral-window-300"])
def test_cuda_graphs_replay_flash_attention_exactly(tiny_folder, tmp_path, smol_tokenizer, model):
    """One sequence at a time, so eager steps and graph replays launch FA2 on the same batch:
    identical tokens, past the first 256-token page (the graphs were captured on contexts of
    one token, and FA2 planned their split of the keys for the model's longest); a Mistral
    whose every layer slides over 300 tokens frees its first page behind the window."""
    from architecture_check import write_tiny_checkpoint
    from octavo import LLM, SamplingParams

    if model == "llama3":
        folder = str(tiny_folder("llama3"))
    else:
        folder = str(
            write_tiny_checkpoint(
                tmp_path,
                "mistral",
                smol_tokenizer,
                architectures=["MistralForCausalLM"],
                sliding_window=300,
            )
        )
    common = dict(device="cuda", dtype="bfloat16", max_model_len=1024, block_size=256)
    common |= dict(attention_backend="FLASH_ATTN", gpu_memory_utilization=0.3)
    prompts = [[1, 5, 9, 13], list(range(3, 300))]
    params = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True)

    def tokens(llm) -> list[list[int]]:
        outs = [llm.generate([{"prompt_token_ids": p}], params, use_tqdm=False) for p in prompts]
        return [list(out[0].outputs[0].token_ids) for out in outs]

    eager = LLM(folder, enforce_eager=True, **common)
    expected = tokens(eager)
    eager.shutdown()
    del eager
    torch.cuda.empty_cache()
    graphed = LLM(folder, **common)
    assert graphed.engine.executor.worker.runner.graphs is not None
    assert tokens(graphed) == expected
    graphed.shutdown()
