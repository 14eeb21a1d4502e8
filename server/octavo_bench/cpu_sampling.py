"""`python -m octavo_bench cpu-sampling`: the CPU sampler, native kernels against torch path.

For each ``--rows`` count and each setting (temperature alone, with top-p, with top-k, with
min-p, with 5 logprobs), ``Sampler`` draws one token per row of vocabulary-sized logits
shaped like a model's (a few likely tokens, a long tail; ``--vocab``, default SmolLM2's
49,152), on ``--num-threads`` threads: the median ms per call of the native kernels
(``Sampler()``) and of the torch path (``Sampler(native=False)``: the filters, a softmax,
the exponential race and torch's logprob packing: what a CPU without the kernels runs).
Greedy rows (one ``max``) are timed as the floor. Writes ``cpu_sampling.json`` and
``cpu_sampling.png``.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass, field

import torch

from octavo.sampling import Sampler, SamplingRow
from octavo.sampling.native_sampler import native_sampling_ops
from octavo.sampling_params import SamplingParams
from octavo_bench.cpu_attention import timed_ms
from octavo_bench.parsers import add_output_dir, int_list, register_subcommand
from octavo_bench.report import machine_info, ratio, save, table

SETTINGS = {  # name: SamplingParams fields
    "greedy": {"temperature": 0.0},
    "temperature 1.0": {"temperature": 1.0},
    "temperature 0.8, top-p 0.95": {"temperature": 0.8, "top_p": 0.95},
    "top-k 50": {"temperature": 0.8, "top_k": 50},
    "min-p 0.05": {"temperature": 0.8, "min_p": 0.05},
    "temperature 0.8, 5 logprobs": {"temperature": 0.8, "logprobs": 5},
}


@dataclass
class CaseResult:
    rows: int
    setting: str
    native_ms: float | None
    torch_ms: float

    @property
    def speedup(self) -> float | None:
        return None if self.native_ms is None else ratio(self.torch_ms, self.native_ms)


@dataclass
class SamplingReport:
    settings: dict
    results: list[CaseResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    machine: dict = field(default_factory=machine_info)

    def to_json(self) -> dict:
        cases = [{**asdict(result), "speedup": result.speedup} for result in self.results]
        return {"settings": self.settings, "machine": self.machine, "cases": cases}

    def text(self) -> str:
        headers = ["rows", "setting", "native ms", "torch ms", "torch / native"]
        body = [
            [str(r.rows), r.setting, _ms(r.native_ms), _ms(r.torch_ms), _times(r.speedup)]
            for r in self.results
        ]
        title = "== CPU sampler: median ms per step (one token per row) =="
        return "\n".join([title, table(headers, body), *self.notes])

    def draw(self, plt):
        figure, axes = plt.subplots(figsize=(9, 4))
        labels = [f"{r.rows} × {r.setting}" for r in self.results]
        positions = range(len(labels))
        axes.barh(
            [p + 0.2 for p in positions],
            [r.torch_ms for r in self.results],
            0.4,
            label="torch path",
        )
        axes.barh(
            [p - 0.2 for p in positions],
            [r.native_ms or 0 for r in self.results],
            0.4,
            label="native",
        )
        axes.set_yticks(list(positions), labels, fontsize=7)
        axes.set_xscale("log")
        axes.set_xlabel("ms per step")
        axes.legend()
        figure.tight_layout()
        return figure


def model_like_logits(rows: int, vocab: int, seed: int = 0) -> torch.Tensor:
    """Rows with a few likely tokens over a long Gaussian tail (as a model's look)."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=generator) * 3.0
    spikes = torch.randint(vocab, (rows, 20), generator=generator)
    return logits.scatter_add_(1, spikes, torch.full((rows, 20), 9.0))


def time_case(rows: int, setting: str, args: argparse.Namespace, native: bool) -> CaseResult:
    logits = model_like_logits(rows, args.vocab)
    params = SamplingParams(**SETTINGS[setting])
    sampling_rows = [SamplingRow(params, [], []) for _ in range(rows)]
    native_ms = None
    if native:
        native_ms = timed_ms(lambda: Sampler()(logits, sampling_rows), args.repeats)
    torch_ms = timed_ms(lambda: Sampler(native=False)(logits, sampling_rows), args.repeats)
    return CaseResult(rows, setting, native_ms, torch_ms)


def run(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.num_threads)
    native = native_sampling_ops(torch.device("cpu")) is not None
    report = SamplingReport({key: str(value) for key, value in vars(args).items() if key != "func"})
    if not native:
        report.notes.append("native kernels unavailable: the torch path alone")
    for rows in args.rows:
        for setting in SETTINGS:
            report.results.append(time_case(rows, setting, args, native))
    save(report, args.output_dir, "cpu_sampling")
    return 0


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _times(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}x"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", type=int_list, default=[1, 32, 256], help="rows per step")
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--num-threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=15, help="timed calls per case")
    add_output_dir(parser, "cpu-sampling")


def register(kinds: argparse._SubParsersAction) -> None:
    help_text = "the CPU sampler: native kernel vs torch path"
    register_subcommand(kinds, "cpu-sampling", help_text, __doc__, "", add_arguments, run)
