"""The sampling settings a benchmark's requests use, the same for every engine it runs.

Greedy by default (the reference figures' setting). ``--temperature`` above 0 makes every
engine sample: Octavo with these ``SamplingParams``, vLLM's runner with the same fields, HF
``generate`` with ``do_sample``. vLLM's own ``bench throughput`` and ``bench latency`` sample
at temperature 1.0 (``VLLM_BENCH``), so sampling costs belong in a throughput comparison.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class SamplingChoice:
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    min_p: float = 0.0

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    def fields(self) -> dict:
        """``SamplingParams`` keyword arguments (Octavo's and vLLM's spell them the same)."""
        return asdict(self)

    def hf_generate_kwargs(self) -> dict:
        """HF ``generate``'s: ``do_sample`` and the filters (its own top-k of 50 off)."""
        if self.is_greedy:
            return {"do_sample": False}
        return {
            "do_sample": True,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k or None,
            "min_p": self.min_p or None,
        }

    def request_fields(self) -> dict:
        """An OpenAI request's sampling fields (top_k and min_p are vLLM's extensions)."""
        return {"temperature": 0.0} if self.is_greedy else self.fields()

    def vllm_client_flags(self) -> list[str]:
        """``vllm bench serve``'s flags for the same requests (it leaves the temperature to
        the server unless told)."""
        flags = []
        for name, value in self.request_fields().items():
            flags += [f"--{name.replace('_', '-')}", str(value)]
        return flags

    def describe(self) -> str:
        if self.is_greedy:
            return "greedy"
        return ", ".join(f"{name} {value}" for name, value in self.fields().items())


GREEDY = SamplingChoice()
VLLM_BENCH = SamplingChoice(temperature=1.0)  # vllm bench throughput/latency's SamplingParams


def add_sampling_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("sampling (every engine; default greedy)")
    group.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    group.add_argument("--top-p", type=float, default=1.0)
    group.add_argument("--top-k", type=int, default=0, help="0: off")
    group.add_argument("--min-p", type=float, default=0.0)


def sampling_from_args(args: argparse.Namespace) -> SamplingChoice:
    """The parsed flags' choice (greedy where a caller's namespace has none of them)."""
    fields = GREEDY.fields()
    return SamplingChoice(**{name: getattr(args, name, fields[name]) for name in fields})
