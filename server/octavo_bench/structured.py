"""`python -m octavo_bench structured`: what constrained decoding costs per token.

20 sequences decode together (the engine's step loop, as with 20 concurrent users), each
128 new tokens with ``ignore_eos``: unconstrained, constrained by a JSON schema (an array
of records, as OpenAI's strict mode allows), and by the same schema with ``maxLength`` on
its strings (xgrammar's slow case), alternating ``--repeats`` times in one run; reported:
tok/s and time per output token of each, and the overhead. Then the compile time of a large
schema (``--schema-properties`` nested properties), first compile and cached.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from octavo import LLM, SamplingParams
from octavo.structured_output.compiler import GrammarCompiler
from octavo.structured_output.params import StructuredOutputsParams
from octavo_bench.engine_options import add_engine_options, default_dtype
from octavo_bench.parsers import add_output_dir, register_subcommand
from octavo_bench.report import machine_info, save, table
from octavo_bench.workloads import chat_prompt


def records(max_length: int | None = None) -> dict[str, Any]:
    """An array of records; strings bounded by ``max_length`` when given (xgrammar then
    checks string tokens one by one: a much slower bitmask)."""
    text = {"type": "string"} if max_length is None else {"type": "string", "maxLength": max_length}
    item = {
        "type": "object",
        "properties": {
            "id": {"type": "integer", "minimum": 0},
            "name": text,
            "role": {"enum": ["admin", "editor", "viewer"]},
            "tags": {"type": "array", "items": text},
        },
        "required": ["id", "name", "role", "tags"],
    }
    return {"type": "array", "items": item}


RECORDS = records()


def large_schema(properties: int) -> dict[str, Any]:
    """An object of ``properties`` fields, each a small nested object with an enum."""
    field_schema = {
        "type": "object",
        "properties": {
            "kind": {"enum": ["a", "b", "c"]},
            "value": {"type": "number"},
            "note": {"type": "string", "pattern": "^[a-z]{1,8}$"},
        },
        "required": ["kind", "value"],
    }
    names = [f"field_{i}" for i in range(properties)]
    return {"type": "object", "properties": dict.fromkeys(names, field_schema), "required": names}


@dataclass
class StructuredReport:
    model: str
    concurrency: int
    output_tokens: int
    tokens_per_s: dict[str, list[float]] = field(default_factory=dict)
    compile_s: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    machine: dict[str, Any] = field(default_factory=machine_info)

    def median(self, mode: str) -> float:
        return statistics.median(self.tokens_per_s[mode])

    def overhead(self, mode: str = "json-schema") -> float:
        """Extra time per token of ``mode`` over unconstrained decoding."""
        return self.median("unconstrained") / self.median(mode) - 1.0

    def to_json(self) -> dict[str, Any]:
        constrained = [mode for mode in self.tokens_per_s if mode != "unconstrained"]
        return {**asdict(self), "overhead": {m: self.overhead(m) for m in constrained}}

    def text(self) -> str:
        rows = [
            [
                mode,
                ", ".join(f"{v:.1f}" for v in values),
                f"{self.median(mode):.1f}",
                f"{1000 * self.concurrency / self.median(mode):.2f}",
            ]
            for mode, values in self.tokens_per_s.items()
        ]
        headers = ["mode", "tok/s runs", "median tok/s", "ms per token per sequence"]
        compile_lines = [f"compile {k}: {v * 1000:.1f} ms" for k, v in self.compile_s.items()]
        return "\n".join(
            [
                f"{self.model}: {self.concurrency} sequences × {self.output_tokens} tokens",
                table(headers, rows),
                *[
                    f"{mode} overhead per token: {100 * self.overhead(mode):+.1f} %"
                    for mode in self.tokens_per_s
                    if mode != "unconstrained"
                ],
                "(target: json-schema <= 10 %)",
                *compile_lines,
                *self.notes,
            ]
        )

    def draw(self, plt: Any) -> Any:
        figure, axis = plt.subplots(figsize=(6, 4))
        modes = list(self.tokens_per_s)
        axis.bar(modes, [self.median(m) for m in modes])
        axis.set_ylabel("output tok/s (median)")
        axis.set_title(f"{self.concurrency} sequences: json-schema {100 * self.overhead():+.1f} %")
        return figure


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="model folder (default: embedded SmolLM2)")
    add_engine_options(parser, {"dtype": default_dtype()})
    parser.add_argument("--concurrency", type=int, default=20)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--schema-properties", type=int, default=200)
    add_output_dir(parser, "structured")


def register(kinds: argparse._SubParsersAction) -> None:
    register_subcommand(
        kinds,
        "structured",
        "constrained vs unconstrained decoding",
        __doc__,
        "",
        add_arguments,
        run,
    )


def run(args: argparse.Namespace) -> int:
    llm = LLM(args.model, dtype=args.dtype, max_model_len=1024)
    prompt = chat_prompt(llm.get_tokenizer(), "List a few records as JSON.")
    report = StructuredReport(
        args.model or "SmolLM2-135M-Instruct", args.concurrency, args.output_len
    )
    modes = {
        "unconstrained": None,
        "json-schema": StructuredOutputsParams(json=RECORDS),
        "json-schema-maxlength": StructuredOutputsParams(json=records(max_length=12)),
    }
    for mode, constraint in [*modes.items()] * args.repeats:  # A, B, A, B, ...
        rate = timed_batch(llm, prompt, args, constraint)
        report.tokens_per_s.setdefault(mode, []).append(rate)
        print(f"{mode}: {rate:.1f} tok/s")
    report.compile_s = compile_times(llm, args.schema_properties)
    save(report, args.output_dir, "structured")
    return 0


def timed_batch(llm: LLM, prompt: list[int], args, constraint) -> float:
    params = SamplingParams(
        temperature=0.0, max_tokens=args.output_len, ignore_eos=True, structured_outputs=constraint
    )
    llm.generate([prompt], params, use_tqdm=False)  # warm-up (and the grammar's compile)
    start = time.perf_counter()
    outputs = llm.generate([prompt] * args.concurrency, params, use_tqdm=False)
    wall = time.perf_counter() - start
    return sum(len(o.outputs[0].token_ids) for o in outputs) / wall


def compile_times(llm: LLM, properties: int) -> dict[str, float]:
    engine = llm.engine
    compiler = GrammarCompiler(
        engine.tokenizer, engine.vocab_size, engine.scheduler.limits.eos_token_ids
    )
    constraint = StructuredOutputsParams(json=large_schema(properties))
    _, first = compiler.compile_timed(constraint)
    _, cached = compiler.compile_timed(constraint)
    return {
        f"{properties}-property schema (first)": first,
        f"{properties}-property schema (cached)": cached or 0.0,
    }
