"""`python -m octavo_bench gpu`: the GPU figures, in one run (what `make gpu-check` calls).

1. Decode at batch 1 against the HBM roofline: a decode step must read every weight once,
   so ``weight bytes / memory bandwidth`` is the fastest a step can be; the bandwidth is
   measured here (a device-to-device copy of 1 GiB: bytes read + written per second).
2. Batch 32 (32 prompts x ``--max-tokens``, greedy, ``ignore_eos``) against HF
   transformers ``generate`` on the same model, dtype and device.
3. Each Triton kernel against the torch path on the same inputs (``gpu_kernels``).

``--device cpu`` runs parts 1 and 2 on the CPU (a smoke run of the same code; the kernel
part needs CUDA and is skipped with a note). Writes gpu.json and gpu.png.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from octavo_bench.baselines import HFBatch, left_padded
from octavo_bench.parsers import add_output_dir, register_subcommand, standalone_parser
from octavo_bench.report import machine_info, save, table

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass
class GpuReport:
    settings: dict[str, Any]
    figures: dict[str, Any] = field(default_factory=dict)
    kernels: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    machine: dict[str, Any] = field(default_factory=machine_info)

    def to_json(self) -> dict[str, Any]:
        return {
            "settings": self.settings,
            "machine": self.machine,
            "figures": self.figures,
            "kernels": self.kernels,
            "notes": self.notes,
        }

    def text(self) -> str:
        rows = [[key, _number(value)] for key, value in self.figures.items()]
        parts = ["== gpu: decode vs roofline, batch 32 vs HF ==", table(["figure", "value"], rows)]
        if self.kernels:
            headers = ["kernel", "triton ms", "torch ms", "speedup", "max |diff|"]
            kernel_rows = [kernel_row(kernel) for kernel in self.kernels]
            parts += ["== Triton kernels vs torch ==", table(headers, kernel_rows)]
        return "\n".join(parts + [f"note: {note}" for note in self.notes])

    def draw(self, plt: Any) -> Any:
        figure, axes = plt.subplots(1, 2, figsize=(10, 4))
        f = self.figures
        axes[0].bar(["roofline", "octavo"], [f["roofline_ms_per_token"], f["b1_ms_per_token"]])
        axes[0].set_title("decode, batch 1: ms per token")
        axes[1].bar(["octavo", "hf"], [f["b32_tok_s"], f.get("hf_b32_tok_s") or 0.0])
        axes[1].set_title("batch 32: output tok/s")
        return figure


def copy_bandwidth(device: torch.device, size: int = 1 << 30, repeats: int = 5) -> float:
    """Bytes per second of a device-to-device copy (each byte read once and written once)."""
    source = torch.empty(size, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    target.copy_(source)
    synchronize(device)
    start = time.perf_counter()
    for _ in range(repeats):
        target.copy_(source)
    synchronize(device)
    return 2 * size * repeats / (time.perf_counter() - start)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def octavo_tok_s(llm, prompts: list[list[int]], max_tokens: int) -> float:
    from octavo import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - start
    return sum(len(out.outputs[0].token_ids) for out in outputs) / wall


def hf_tok_s(folder: str, dtype: torch.dtype, device: torch.device, batch: HFBatch) -> float:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(device).eval()
    ids, mask = (t.to(device) for t in left_padded(batch.prompts, 0))
    settings = dict(do_sample=False, pad_token_id=0, attention_mask=mask)
    with torch.inference_mode():
        model.generate(ids, max_new_tokens=4, min_new_tokens=4, **settings)
        synchronize(device)
        start = time.perf_counter()
        length = batch.max_new_tokens
        out = model.generate(ids, max_new_tokens=length, min_new_tokens=length, **settings)
        synchronize(device)
    return (out.shape[1] - ids.shape[1]) * ids.shape[0] / (time.perf_counter() - start)


def kernel_row(kernel: dict) -> list[str]:
    times = [f"{kernel['triton_ms']:.4f}", f"{kernel['torch_ms']:.4f}"]
    return [kernel["name"], *times, f"{kernel['speedup']:.2f}x", f"{kernel['max_abs_diff']:.2e}"]


def _number(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def prompts_of(count: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(10, min(vocab, 30000), (count, length), generator=generator)
    return ids.tolist()


def measure(args: argparse.Namespace, report: GpuReport) -> None:
    from octavo import LLM
    from octavo.model_executor.loader import weight_bytes

    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    extra = {} if args.kv_cache_memory is None else {"kv_cache_memory": args.kv_cache_memory}
    llm = LLM(
        args.model, dtype=args.dtype, device=args.device, max_model_len=args.max_model_len, **extra
    )
    model = llm.engine.executor.worker.model
    weights = weight_bytes(model)
    bandwidth = copy_bandwidth(device, args.copy_bytes)
    prompts = prompts_of(args.batch, args.prompt_len, llm.engine.vocab_size)
    single = octavo_tok_s(llm, prompts[:1], args.max_tokens)
    batched = octavo_tok_s(llm, prompts, args.max_tokens)
    roofline_ms = 1000.0 * weights / bandwidth
    report.figures.update(
        weight_bytes=weights,
        copy_bandwidth_gb_s=bandwidth / 1e9,
        roofline_ms_per_token=roofline_ms,
        b1_ms_per_token=1000.0 / single,
        b1_fraction_of_roofline=roofline_ms * single / 1000.0,
        b32_tok_s=batched,
    )
    del llm
    if args.hf:
        batch = HFBatch(prompts, args.max_tokens, args.max_tokens * len(prompts))
        report.figures["hf_b32_tok_s"] = hf_tok_s(args.model, dtype, device, batch)
        report.figures["b32_vs_hf"] = batched / report.figures["hf_b32_tok_s"]
    if device.type == "cuda":
        from octavo_bench.gpu_kernels import all_kernels

        report.kernels = [result.to_json() for result in all_kernels(device, dtype)]
    else:
        report.notes.append(
            "kernels skipped: Triton kernels need CUDA (the unit tests check them on CPU "
            "under TRITON_INTERPRET=1)"
        )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="HF model folder (random-model makes one)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--copy-bytes", type=int, default=1 << 30, help="bandwidth probe size")
    parser.add_argument(
        "--kv-cache-memory", type=int, default=None, help="bytes (default: the engine's sizing)"
    )
    parser.add_argument("--hf", action=argparse.BooleanOptionalAction, default=True)
    add_output_dir(parser, "gpu")


def run(args: argparse.Namespace) -> int:
    report = GpuReport({key: str(value) for key, value in vars(args).items() if key != "func"})
    measure(args, report)
    save(report, args.output_dir, "gpu")
    return 0


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


def register(kinds: argparse._SubParsersAction) -> None:
    help_text = "GPU figures: decode vs the HBM roofline, batch 32 vs HF, Triton vs torch"
    register_subcommand(kinds, "gpu", help_text, __doc__, "", add_arguments, run)


def build_parser() -> argparse.ArgumentParser:
    return standalone_parser("gpu", __doc__, "", add_arguments)
