"""`octavo_bench gpu`'s report: one row per figure, a column for CUDA graphs (the default),
one for graphs with torch's FlashAttention-2 (``--attention-backend FLASH_ATTN --block-size
256``), one for graphs with ``--async-scheduling`` and one for ``--enforce-eager``, the
issue's target beside them; gpu.json and gpu.png."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from octavo_bench.report import machine_info, table

# graphs: the engine's default; flash: graphs with FLASH_ATTN in blocks of 256 (CUDA only);
# async: graphs with --async-scheduling; eager: --enforce-eager
MODES = ("graphs", "flash", "async", "eager")
# each mode's engine arguments beside the bench's own
MODE_SETTINGS = {
    "graphs": {},
    "flash": {"attention_backend": "FLASH_ATTN", "block_size": 256},
    "async": {"async_scheduling": True},
    "eager": {"enforce_eager": True},
}


def mode_flags(mode: str) -> list[str]:
    """``MODE_SETTINGS[mode]`` as ``octavo serve`` flags."""
    flags = []
    for name, value in MODE_SETTINGS[mode].items():
        flag = "--" + name.replace("_", "-")
        flags += [flag] if value is True else [flag, str(value)]
    return flags


@dataclass(frozen=True)
class Row:
    key: str
    label: str
    target: str = ""


ROWS = (
    Row("b1_ms_per_token", "1B decode, batch 1: ms per token", "<= 1.3 (2 first)"),
    Row("b1_fraction_of_roofline", "1B batch 1: fraction of the roofline"),
    Row("b1_gpu_ms_per_step", "1B batch 1: GPU kernel ms per step (eager)"),
    Row("b32_ms_per_step", "1B decode, batch 32: ms per step"),
    Row("b32_step_over_b1", "batch-32 step / batch-1 step", "<= 1.5"),
    Row("b32_tok_s", "1B batch 32 x 128: output tok/s"),
    Row("b32_vs_hf", "1B batch 32: x HF generate (same run)"),
    Row("offline_1b_tok_s", "nano-vllm offline, 1B: output tok/s", ">= 15000"),
    Row("offline_qwen3_tok_s", "nano-vllm offline, Qwen3-0.6B: output tok/s", ">= 10000"),
    Row("b1_8b_ms_per_token", "8B decode, batch 1: ms per token"),
    Row("b1_8b_fraction_of_roofline", "8B batch 1: fraction of the roofline", ">= 0.70"),
    Row("b1_8b_gpu_ms_per_step", "8B batch 1: GPU kernel ms per step (eager)"),
    Row("served_tok_s", "1B served, ShareGPT-shaped, Poisson: output tok/s"),
    Row("served_hf_tok_s", "the same on HF, one request at a time: tok/s"),
    Row("served_vs_hf", "1B served: x HF server (same run)", ">= 24"),
    Row("start_1b_s", "1B engine start (load, profile, capture): s"),
    Row("start_qwen3_s", "Qwen3-0.6B engine start: s"),
    Row("start_8b_s", "8B engine start: s"),
)


@dataclass
class GpuReport:
    settings: dict[str, Any]
    figures: dict[str, dict[str, Any]] = field(default_factory=lambda: {m: {} for m in MODES})
    common: dict[str, Any] = field(default_factory=dict)  # the same for both modes
    kernels: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    machine: dict[str, Any] = field(default_factory=machine_info)

    def to_json(self) -> dict[str, Any]:
        return {
            "settings": self.settings,
            "machine": self.machine,
            "common": self.common,
            "figures": self.figures,
            "targets": {row.key: row.target for row in ROWS if row.target},
            "kernels": self.kernels,
            "notes": self.notes,
        }

    def flat(self) -> dict[str, Any]:
        """Every figure under one key (``graphs.b1_ms_per_token``, ``weight_bytes``)."""
        flat = dict(self.common)
        for mode, figures in self.figures.items():
            flat.update((f"{mode}.{key}", value) for key, value in figures.items())
        return flat

    def text(self) -> str:
        rows = [
            [row.label, *(number(self.figures[m].get(row.key)) for m in MODES), row.target]
            for row in ROWS
            if any(row.key in self.figures[m] for m in MODES)
        ]
        headers = ["figure", *MODES, "target"]
        title = "== gpu: CUDA graphs, with --async-scheduling, and --enforce-eager =="
        parts = [title, table(headers, rows)]
        common = [[key, number(value)] for key, value in self.common.items()]
        parts += ["== common to both modes ==", table(["figure", "value"], common)]
        if self.kernels:
            headers = ["kernel", "triton ms", "torch ms", "speedup", "max |diff|", "FA2 ms"]
            kernel_rows = [kernel_row(kernel) for kernel in self.kernels]
            title = "== Triton kernels vs torch (FA2: torch's FlashAttention-2, blocks of 256) =="
            parts += [title, table(headers, kernel_rows)]
        return "\n".join(parts + [f"note: {note}" for note in self.notes])

    def draw(self, plt: Any) -> Any:
        figure, axes = plt.subplots(1, 3, figsize=(14, 4))
        modes, common = [self.figures[m] for m in MODES], self.common
        for axis, key, roofline, title in (
            (axes[0], "b1_ms_per_token", "roofline_ms_per_token", "1B decode, batch 1: ms/token"),
            (axes[2], "b1_8b_ms_per_token", "roofline_8b_ms_per_token", "8B, batch 1: ms/token"),
        ):
            values = [common.get(roofline), *(mode.get(key) for mode in modes)]
            axis.bar(["roofline", *MODES], [v or 0.0 for v in values])
            axis.set_title(title)
        keys = ("b32_tok_s", "offline_1b_tok_s", "offline_qwen3_tok_s")
        positions, width = range(len(keys)), 0.8 / len(MODES)
        for index, mode in enumerate(modes):
            shift = (index - (len(MODES) - 1) / 2) * width
            axes[1].bar([p + shift for p in positions], [mode.get(k) or 0.0 for k in keys], width)
        axes[1].set_xticks(list(positions), ["b32 x 128", "offline 1B", "offline Qwen3"])
        axes[1].legend(list(MODES))
        axes[1].set_title("output tok/s")
        return figure


def kernel_row(kernel: dict) -> list[str]:
    times = [f"{kernel['triton_ms']:.4f}", f"{kernel['torch_ms']:.4f}"]
    flash = kernel.get("flash_ms")  # absent from reports written before the FA2 rows
    cells = [f"{kernel['speedup']:.2f}x", f"{kernel['max_abs_diff']:.2e}"]
    return [kernel["name"], *times, *cells, "-" if flash is None else f"{flash:.4f}"]


def number(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if isinstance(value, float) else str(value)
