"""`python -m octavo_bench step-profile`: where one engine step's time goes, by phase.

For each batch size, ``batch`` prompts decode ``--steps`` tokens each (greedy,
``ignore_eos``) and every phase of the engine's steps is timed on the host: the
scheduler, the runner's input preparation, the forward's launch (on a GPU the graph
replay or the eager kernels are queued, not waited for), sampling (queued too), the wait
for the sampled ids to reach the host, the scheduler's update and the engine's
detokenizing; ``--count-syncs`` (CUDA) also counts, per phase, the calls that made the
host wait for the GPU. On a GPU the forward's device
time is read from CUDA events around it, so host overhead and GPU time sit side by side:
a step is host-bound where ``step`` far exceeds ``gpu_forward_ms``. ``--offline 256`` adds a
row for nano-vllm's offline shape (256 requests, prompt and output lengths uniform in
[100, 1024]: ``--offline-max-len``): its steps with a prefill part, and the forward's GPU
seconds in those steps and in decode-only steps. Each row also counts its forwards by path:
a decode graph replayed, the pieces cut at attention (``piecewise_graphs``), or eager.
``--compare-async`` runs every row with steps in turn and with ``--async-scheduling``
alternately in one engine, ``--rounds`` times each (a lent VM's host speed drifts by up to
2x between runs, so two runs compare poorly; alternating in one run puts the drift on
both sides). Writes step_profile.json and step_profile.png (the phases of a step,
stacked, per row).
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from octavo_bench.parsers import add_output_dir, register_subcommand, standalone_parser
from octavo_bench.report import machine_info, save, table

PHASES = {  # (object path, method) -> phase name
    ("scheduler", "schedule"): "schedule",
    ("runner", "prepare"): "prepare",
    ("runner", "_forward"): "forward_launch",
    ("runner", "_outputs"): "sample",
    ("pending", "output"): "wait",
    ("scheduler", "update_from_output"): "update",
    ("engine", "_record_all"): "detokenize",
}
SYNC_WARNING = "called a synchronizing CUDA operation"  # torch's sync debug mode says so
# the forwards of a row's steps by how they ran: a decode graph, the pieces cut at
# attention (piecewise_graphs), or eagerly
FORWARD_PATHS = ("decode_graph", "pieces")


OFFLINE_TOTALS = (
    "wall_s",
    "prefill_steps",
    "gpu_prefill_steps_s",
    "gpu_decode_steps_s",
    "prefill_step_ms_median",
    "prefill_step_ms_max",
)


class PhaseTimer:
    """Wraps the engine's phase methods with host timers (and CUDA events on the forward).

    ``count_syncs`` (CUDA): torch's sync debug mode warns at each call that makes the host
    wait for the GPU; the warnings are counted per phase (a phase that waits in async
    scheduling loses the overlap)."""

    def __init__(self, engine: Any, count_syncs: bool = False) -> None:
        from octavo.model_executor.pending_step import PendingStep

        self.seconds: collections.Counter[str] = collections.Counter()
        self.calls: collections.Counter[str] = collections.Counter()
        self.syncs: collections.Counter[str] = collections.Counter()
        self.count_syncs = count_syncs
        if count_syncs and torch.cuda.is_available():
            torch.cuda.set_sync_debug_mode("warn")
        self._originals: list[tuple[Any, str, Callable, bool]] = []  # close() puts back
        self.events: list[tuple[torch.cuda.Event, torch.cuda.Event, bool]] = []
        self.steps = 0
        self.prefill_steps = 0
        self.planned_prefill = False  # the last planned step has a prefill part
        owners = {"engine": engine, "scheduler": engine.scheduler}
        runner = owners["runner"] = engine.executor.worker.runner
        owners["pending"] = PendingStep  # the host's wait for a step's sampled ids
        for (owner, method), phase in PHASES.items():
            self._wrap(owners[owner], method, phase)
        self._wrap(engine, "step", "step")
        for path, replays in (("decode_graph", runner.graphs), ("pieces", runner.piecewise)):
            if replays is not None:  # how many forwards replayed each kind of graph
                self._wrap(replays, "run", path)

    def _wrap(self, owner: Any, method: str, phase: str) -> None:
        original: Callable = getattr(owner, method)
        own = isinstance(owner, type) or method in vars(owner)  # else the class's method
        self._originals.append((owner, method, original, own))
        on_gpu = phase == "forward_launch" and torch.cuda.is_available()

        def timed(*args, **kwargs):
            if on_gpu:
                start_event, end_event = torch.cuda.Event(True), torch.cuda.Event(True)
                start_event.record()
            start = time.perf_counter()
            result = self._call(phase, original, args, kwargs)
            self.seconds[phase] += time.perf_counter() - start
            self.calls[phase] += 1
            if on_gpu:
                end_event.record()
                self.events.append((start_event, end_event, self.planned_prefill))
            if phase == "schedule" and not getattr(result, "is_empty", True):
                self.planned_prefill = bool(result.prefills)
                self.prefill_steps += self.planned_prefill
            self.steps += phase == "step"
            return result

        setattr(owner, method, timed)

    def close(self) -> None:
        """Put every wrapped method back (``PendingStep.output`` is the class's own)."""
        for owner, method, original, own in reversed(self._originals):
            if own:
                setattr(owner, method, original)
            else:
                delattr(owner, method)  # the instance's wrapper hid the class's method
        self._originals.clear()
        if self.count_syncs and torch.cuda.is_available():
            torch.cuda.set_sync_debug_mode("default")

    def _call(self, phase: str, original: Callable, args: tuple, kwargs: dict) -> Any:
        if not self.count_syncs or phase in FORWARD_PATHS:  # counted in forward_launch
            return original(*args, **kwargs)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = original(*args, **kwargs)
        self.syncs[phase] += sum(SYNC_WARNING in str(w.message) for w in caught)
        return result

    def reset(self) -> None:
        self.syncs.clear()
        self.seconds.clear()
        self.calls.clear()
        self.events.clear()
        self.steps = self.prefill_steps = 0

    def per_step_ms(self) -> dict[str, float]:
        steps = max(1, self.steps)
        result = {phase: 1000 * self.seconds[phase] / steps for phase in [*PHASES.values(), "step"]}
        forwards = {path: self.calls[path] for path in FORWARD_PATHS}
        forwards["eager"] = self.calls["forward_launch"] - sum(forwards.values())
        result["forwards"] = forwards
        if self.events:
            torch.cuda.synchronize()
            gpu = sum(start.elapsed_time(end) for start, end, _ in self.events)
            result["gpu_forward_ms"] = gpu / steps
        if self.count_syncs:  # a phase's recorder keeps its warnings from the step's
            counts = {phase: self.syncs[phase] for phase in PHASES.values()}
            counts["other"] = self.syncs["step"]  # outside every named phase
            counts["step"] = sum(counts.values())
            result["syncs_per_step"] = {phase: n / steps for phase, n in counts.items()}
        return result

    def gpu_seconds_by_kind(self) -> dict[str, float]:
        """The forward's GPU seconds in steps with a prefill part and in decode-only steps,
        and the median and longest prefill step (ms): a few long ones against a short
        median are kernels compiling mid-run, all of them long is the prefill's own cost."""
        torch.cuda.synchronize()
        totals = {"gpu_prefill_steps_s": 0.0, "gpu_decode_steps_s": 0.0}
        prefill_ms = []
        for start, end, prefill in self.events:
            key = "gpu_prefill_steps_s" if prefill else "gpu_decode_steps_s"
            totals[key] += start.elapsed_time(end) / 1000
            if prefill:
                prefill_ms.append(start.elapsed_time(end))
        if prefill_ms:
            totals["prefill_step_ms_median"] = statistics.median(prefill_ms)
            totals["prefill_step_ms_max"] = max(prefill_ms)
        return totals


def set_overlap(llm: Any, mode: str) -> None:
    """Steps in turn ("sync") or overlapped ("async") from the next step on; the engine
    is idle, so no step is in flight to finish in the other mode."""
    engine = llm.engine
    if engine._launched is not None or engine.executor.worker.runner.in_flight is not None:
        raise RuntimeError("the scheduling mode changes only while no step is in flight")
    engine.scheduler.overlapped = mode == "async"


def profile_batch(llm: Any, timer: PhaseTimer, batch: int, steps: int, prompt_len: int) -> dict:
    from octavo import SamplingParams

    prompts = [[10 + (i * 7 + j) % 1000 for j in range(prompt_len)] for i in range(batch)]
    params = SamplingParams(temperature=0, max_tokens=steps, ignore_eos=True)
    for _ in range(2):  # the second run's prefill hits the prefix cache, as the timed one's
        llm.generate(prompts, SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)
    timer.reset()
    start = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - start
    row = {"batch": batch, "steps": timer.steps, "tok_s": batch * steps / wall}
    row.update(timer.per_step_ms())
    return row


def profile_offline(llm: Any, timer: PhaseTimer, seqs: int, max_len: int) -> dict:
    """nano-vllm's offline shape under the timer: where its wall time goes."""
    from octavo_bench.gpu_measures import OfflineShape, offline_workload, timed_generate

    shape = OfflineShape(seqs, min(100, max_len), max_len)
    prompts, params = offline_workload(llm, shape)
    llm.engine.scheduler.kv.pool.reset_prefix_cache()  # cold: another mode's run cached them
    timer.reset()
    wall, tokens = timed_generate(llm, prompts, params)
    row = {"batch": "offline", "steps": timer.steps, "tok_s": tokens / wall, "wall_s": wall}
    row.update(timer.per_step_ms(), prefill_steps=timer.prefill_steps)
    if timer.events:
        row.update(timer.gpu_seconds_by_kind())
    return row


@dataclass
class StepProfileReport:
    settings: dict[str, str]
    rows: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    machine: dict[str, Any] = field(default_factory=machine_info)

    def to_json(self) -> dict[str, Any]:
        return {"settings": self.settings, "machine": self.machine, "rows": self.rows}

    def text(self) -> str:
        columns = ["mode", "batch", "tok_s", "step", *PHASES.values(), "gpu_forward_ms"]
        body = [[_cell(row.get(name)) for name in columns] for row in self.rows]
        title = "== step profile: ms per step by phase (host), GPU forward (CUDA events) =="
        lines = [title, table(columns, body), *self.notes]
        for row in self.rows:
            if row["batch"] == "offline":
                totals = ", ".join(f"{key} {_cell(row.get(key))}" for key in OFFLINE_TOTALS)
                lines.append(f"offline ({row['mode']}): {row['steps']} steps, {totals}")
            name = f"batch {row['batch']} ({row['mode']})"
            forwards = ", ".join(f"{k} {v}" for k, v in row.get("forwards", {}).items())
            lines.append(f"{name}: forwards by path: {forwards}")
            if "syncs_per_step" in row:
                syncs = ", ".join(f"{k} {v:.2f}" for k, v in row["syncs_per_step"].items())
                lines.append(f"{name}: host waits per step: {syncs}")
        return "\n".join(lines)

    def draw(self, plt: Any) -> Any:
        figure, axes = plt.subplots(figsize=(8, 4))
        labels = [f"{row['batch']} {row['mode']} {row['round']}" for row in self.rows]
        bottom = [0.0] * len(self.rows)
        for phase in PHASES.values():
            heights = [row[phase] for row in self.rows]
            axes.bar(labels, heights, bottom=bottom, label=phase)
            bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
        axes.set_xlabel("batch size, mode, round")
        axes.tick_params(axis="x", labelrotation=45)
        axes.set_ylabel("ms per step")
        axes.legend()
        return figure


def run(args: argparse.Namespace) -> int:
    from octavo import LLM

    kwargs = {
        "enforce_eager": args.enforce_eager,
        "load_format": args.load_format,
        "async_scheduling": args.async_scheduling or args.compare_async,
    }
    llm = LLM(args.model, device=args.device, dtype=args.dtype, max_model_len=2048, **kwargs)
    timer = PhaseTimer(llm.engine, args.count_syncs)
    report = StepProfileReport(_settings(args))
    if args.count_syncs and not torch.cuda.is_available():
        report.notes.append("--count-syncs: torch's sync debug mode is CUDA's; none counted")
    if args.compare_async and not llm.engine.scheduler.overlapped:
        report.notes.append("--compare-async: this engine cannot overlap steps; in turn only")
    try:
        for mode, round_index, part in _plan(args, llm.engine.scheduler.overlapped):
            set_overlap(llm, mode)
            if part == "offline":
                row = profile_offline(llm, timer, args.offline, args.offline_max_len)
            else:
                row = profile_batch(llm, timer, part, args.steps, args.prompt_len)
            report.rows.append({"mode": mode, "round": round_index, **row})
    finally:
        timer.close()
        llm.shutdown()
    save(report, args.output_dir, "step_profile")
    return 0


def _plan(args: argparse.Namespace, overlaps: bool) -> list[tuple[str, int, int | str]]:
    """(mode, round, batch size or "offline") in the order they run: with
    ``--compare-async`` each round runs every batch size in both modes, one after the
    other, and the offline shape runs once in each mode after the rounds."""
    modes = ["async" if overlaps else "sync"]
    if args.compare_async and overlaps:  # else the engine cannot overlap (a note says so)
        modes = ["sync", "async"]
    rounds = args.rounds if len(modes) > 1 else 1
    plan = [
        (mode, index, batch)
        for index in range(rounds)
        for batch in args.batches
        for mode in (modes if index % 2 == 0 else modes[::-1])
    ]
    if args.offline:
        plan += [(mode, 0, "offline") for mode in modes]
    return plan


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def _settings(args: argparse.Namespace) -> dict[str, str]:
    return {key: str(value) for key, value in vars(args).items() if key != "func"}


def _sizes(text: str) -> list[int]:
    return [int(size) for size in text.split(",") if size.strip()]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="HF model folder")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--load-format", default="auto", choices=("auto", "dummy"))
    parser.add_argument(
        "--batches", type=_sizes, default=[1, 32, 256], help="comma-separated batch sizes"
    )
    parser.add_argument("--steps", type=int, default=64, help="decode steps per batch")
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument(
        "--offline", type=int, default=0, help="requests of nano-vllm's offline shape (256)"
    )
    parser.add_argument("--offline-max-len", type=int, default=1024)
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument(
        "--async-scheduling", action="store_true", help="plan each step while the last runs"
    )
    parser.add_argument(
        "--compare-async",
        action="store_true",
        help="every row with steps in turn and with --async-scheduling, alternately in one "
        "engine (--rounds times each)",
    )
    parser.add_argument("--rounds", type=int, default=2, help="rounds of --compare-async")
    parser.add_argument(
        "--count-syncs",
        action="store_true",
        help="CUDA: count the calls that make the host wait for the GPU, per phase (torch's "
        "sync debug mode; adds a little host time to every phase)",
    )
    add_output_dir(parser, "step-profile")


def register(kinds: argparse._SubParsersAction) -> None:
    help_text = "per-phase host time and GPU forward time of engine steps"
    register_subcommand(kinds, "step-profile", help_text, __doc__, "", add_arguments, run)


def build_parser() -> argparse.ArgumentParser:
    return standalone_parser("step-profile", __doc__, "", add_arguments)


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))
