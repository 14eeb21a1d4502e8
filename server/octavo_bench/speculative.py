"""`python -m octavo_bench speculative`: Octavo with and without speculative decoding.

Variants (``--variants``): ``off`` (no speculation), ``ngram`` (prompt lookup,
``--k`` proposals), ``draft`` (a draft model, ``--draft-model``; the embedded SmolLM2 is
the smallest model available offline, so drafting for itself shows the mechanism's
cost, not a speed-up). Workloads: input-grounded (copy or edit a paragraph given in the
prompt) and free generation (stories), each as a single stream (``--single`` requests
one after the other) and as 20 concurrent users (``--users`` requests in flight at
once). Baseline in the same run: HF transformers ``generate`` single stream, plain and
with ``prompt_lookup_num_tokens`` (its n-gram speculation).

Reported per run: output tok/s, TPOT (median over requests of the time between a
request's first and last token per further token), acceptance rate and mean accepted
length, and each variant's ratio to ``off``; JSON + PNG.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from octavo import LLM, SamplingParams
from octavo.model_executor.model_folders import load_tokenizer, resolve_model_folder
from octavo_bench.engine_options import add_engine_options, default_dtype, threads_used
from octavo_bench.engine_runs import per_request_tpot_ms
from octavo_bench.parsers import add_output_dir, register_subcommand
from octavo_bench.report import machine_info, ratio, save, table
from octavo_bench.speculative_workloads import SpecWorkload, free_workload, grounded_workload

VARIANTS = ("off", "ngram", "draft")
HF = "hf"
HF_LOOKUP = "hf prompt lookup"


@dataclass
class SpecRun:
    variant: str
    workload: str  # grounded / free
    users: int  # requests in flight at once
    tok_s: float
    tpot_ms: float | None
    output_tokens: int
    acceptance_rate: float | None = None
    mean_accepted_length: float | None = None


@dataclass
class SpecReport:
    model: str
    dtype: str
    threads: int
    k: int
    runs: list[SpecRun] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    machine: dict[str, Any] = field(default_factory=machine_info)

    def versus_off(self, run: SpecRun) -> float | None:
        base = [
            r
            for r in self.runs
            if (r.variant, r.workload, r.users) == ("off", run.workload, run.users)
        ]
        return ratio(run.tok_s, base[0].tok_s) if base else None

    def to_json(self) -> dict[str, Any]:
        runs = [{**asdict(r), "vs_off": self.versus_off(r)} for r in self.runs]
        return {
            "model": self.model,
            "dtype": self.dtype,
            "threads": self.threads,
            "num_speculative_tokens": self.k,
            "runs": runs,
            "notes": self.notes,
            "machine": self.machine,
        }

    def text(self) -> str:
        rows = [
            [
                r.variant,
                r.workload,
                str(r.users),
                f"{r.tok_s:.1f}",
                _fmt(r.tpot_ms, "ms"),
                _fmt(self.versus_off(r), "x"),
                _fmt(r.acceptance_rate, ""),
                _fmt(r.mean_accepted_length, ""),
            ]
            for r in self.runs
        ]
        headers = [
            "variant",
            "workload",
            "users",
            "tok/s",
            "TPOT",
            "vs off",
            "acceptance",
            "tokens/verify",
        ]
        return "\n".join(
            [
                f"{self.model} ({self.dtype}, {self.threads} threads, k={self.k})",
                table(headers, rows),
                *self.notes,
            ]
        )

    def draw(self, plt: Any) -> Any:
        groups = sorted({(r.workload, r.users) for r in self.runs})
        figure, axes = plt.subplots(1, len(groups), figsize=(4 * len(groups), 4), squeeze=False)
        for axis, (workload, users) in zip(axes[0], groups, strict=True):
            runs = [r for r in self.runs if (r.workload, r.users) == (workload, users)]
            bars = axis.bar([r.variant for r in runs], [r.tok_s for r in runs])
            axis.bar_label(
                bars, [f"{r.tok_s:.0f}\n{_fmt(self.versus_off(r), 'x')}" for r in runs], fontsize=8
            )
            axis.set_ylim(0, 1.3 * max(r.tok_s for r in runs))
            axis.set_title(f"{workload}, {users} user(s): tok/s", fontsize=9)
            axis.tick_params(axis="x", labelsize=7)
        return figure


def _fmt(value: float | None, unit: str) -> str:
    return "-" if value is None else f"{value:.2f}{unit}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--variants",
        default="off,ngram",
        help="comma-separated: off,ngram,draft (default: %(default)s)",
    )
    parser.add_argument("--k", type=int, default=4, help="num_speculative_tokens (default: 4)")
    parser.add_argument("--model", default=None, help="model folder (default: embedded SmolLM2)")
    parser.add_argument(
        "--draft-model",
        default=None,
        help="draft model folder (default: the model, drafting for itself)",
    )
    add_engine_options(parser, {"dtype": default_dtype(), "num_threads": None})
    parser.add_argument("--single", type=int, default=4, help="single-stream requests")
    parser.add_argument("--users", type=int, default=20, help="concurrent users")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--no-hf", action="store_true", help="skip the HF transformers runs")
    add_output_dir(parser, "speculative")


def register(kinds: argparse._SubParsersAction) -> None:
    register_subcommand(
        kinds,
        "speculative",
        "with and without speculative decoding",
        __doc__,
        "",
        add_arguments,
        run,
    )


def run(args: argparse.Namespace) -> int:
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        raise ValueError(f"unknown variants {unknown}; known: {list(VARIANTS)}")
    folder = resolve_model_folder(args.model)
    tokenizer = load_tokenizer(folder)
    count = max(args.single, args.users)
    workloads = [
        grounded_workload(tokenizer, count, args.max_tokens),
        free_workload(tokenizer, count, args.max_tokens),
    ]
    threads = threads_used(args.num_threads)
    report = SpecReport(folder.name, args.dtype, threads, args.k)
    for variant in variants:
        config = speculative_config(variant, args, str(folder))
        with LLM(
            str(folder),
            dtype=args.dtype,
            max_model_len=1024,
            num_threads=threads,
            speculative_config=config,
        ) as llm:
            llm.generate([workloads[0].prompts[0]], SamplingParams(max_tokens=8), use_tqdm=False)
            for workload in workloads:
                report.runs.append(run_engine(llm, variant, workload, 1, args.single))
                report.runs.append(run_engine(llm, variant, workload, args.users, args.users))
    if not args.no_hf:
        report.runs += run_hf(folder, workloads, args, threads)
    save(report, args.output_dir, "speculative")
    return 0


def speculative_config(variant: str, args: argparse.Namespace, folder: str) -> dict | None:
    if variant == "off":
        return None
    if variant == "ngram":
        return {
            "method": "ngram",
            "num_speculative_tokens": args.k,
            "prompt_lookup_max": 4,
            "prompt_lookup_min": 2,
        }
    return {"model": args.draft_model or folder, "num_speculative_tokens": args.k}


def run_engine(llm: LLM, variant: str, workload: SpecWorkload, users: int, total: int) -> SpecRun:
    """``total`` requests, ``users`` in flight at a time (1: one after the other)."""
    params = SamplingParams(
        temperature=0, max_tokens=workload.max_tokens, ignore_eos=workload.ignore_eos
    )
    before = llm.engine.stats().spec_decode
    start, outputs = time.perf_counter(), []
    for first in range(0, total, users):
        prompts = workload.prompts[first : min(total, first + users)]
        outputs += llm.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - start
    tokens = sum(len(out.outputs[0].token_ids) for out in outputs)
    result = SpecRun(variant, workload.name, users, tokens / wall, _tpot_ms(outputs), tokens)
    after = llm.engine.stats().spec_decode
    if after is not None and before is not None and after.num_drafts > before.num_drafts:
        recent = after.since(before)
        result.acceptance_rate = recent.acceptance_rate
        result.mean_accepted_length = recent.mean_accepted_length
    return result


def _tpot_ms(outputs) -> float | None:
    per_request = per_request_tpot_ms(outputs)
    return statistics.median(per_request) if per_request else None


def run_hf(folder, workloads: list[SpecWorkload], args, threads: int) -> list[SpecRun]:
    """HF transformers single stream, plain and with prompt lookup, same prompts."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    dtype = torch.bfloat16 if args.dtype == "bfloat16" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()
    runs = []
    for workload in workloads:
        for label, extra in ((HF, {}), (HF_LOOKUP, {"prompt_lookup_num_tokens": args.k})):
            tokens, start = 0, time.perf_counter()
            for prompt in workload.prompts[: args.single]:
                tokens += _hf_generate(model, prompt, workload, extra)
            runs.append(
                SpecRun(
                    label, workload.name, 1, tokens / (time.perf_counter() - start), None, tokens
                )
            )
    return runs


def _hf_generate(model, prompt: list[int], workload: SpecWorkload, extra: dict) -> int:
    import torch

    ids = torch.tensor([prompt])
    length = {
        "max_new_tokens": workload.max_tokens,
        "min_new_tokens": workload.max_tokens if workload.ignore_eos else 0,
    }
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            pad_token_id=model.generation_config.eos_token_id,
            **length,
            **extra,
        )
    return out.shape[1] - len(prompt)
