"""The ``kv-offload`` benchmark's results: per-turn TTFT and recomputed prompt tokens of
each setting (the offload tier on and off), as text, JSON and a PNG."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from octavo_bench.report import ratio, table

TIER, NO_TIER = "octavo-tier", "octavo-no-tier"


@dataclass
class TurnRecord:
    """One request: a conversation's turn (0: the first message, nothing to reuse)."""

    turn: int
    conversation: int
    prompt_tokens: int
    cached_tokens: int  # taken from the pool or loaded from the tier, not recomputed
    ttft_s: float  # wall seconds from submission to the first token
    ttft_cpu_s: float  # this process's CPU seconds (user + sys) over the same span


@dataclass
class EngineCounters:
    """The engine's own counters over the timed requests (differences of its totals)."""

    prompt_tokens: int
    prefix_cache_hits: int  # every cached token, the pool's and the tier's
    tier_hits: int  # of which loaded from the offload tier
    tier_stored_blocks: int
    tier_loaded_blocks: int

    @property
    def recomputed(self) -> int:
        return self.prompt_tokens - self.prefix_cache_hits

    @property
    def pool_hits(self) -> int:
        return self.prefix_cache_hits - self.tier_hits


@dataclass
class SettingResult:
    name: str
    kv_offloading_size_gib: float | None
    records: list[TurnRecord] = field(default_factory=list)
    counters: EngineCounters | None = None
    wall_s: float = 0.0
    cpu_s: float = 0.0  # user + sys of this process (the engine runs in it)

    def ttfts_ms(
        self, turn: int | None = None, after_first: bool = False, cpu: bool = False
    ) -> list[float]:
        """TTFTs in ms (``cpu``: the CPU seconds to the first token instead of wall)."""
        return [
            1000 * (r.ttft_cpu_s if cpu else r.ttft_s)
            for r in self.records
            if (turn is None or r.turn == turn) and (not after_first or r.turn > 0)
        ]

    def turns(self) -> list[int]:
        return sorted({r.turn for r in self.records})

    def recomputed_by_turn(self) -> dict[int, int]:
        totals = dict.fromkeys(self.turns(), 0)
        for r in self.records:
            totals[r.turn] += r.prompt_tokens - r.cached_tokens
        return totals

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kv_offloading_size_gib": self.kv_offloading_size_gib,
            "wall_s": self.wall_s,
            "cpu_s": self.cpu_s,
            "ttft_ms_by_turn": {t: percentiles(self.ttfts_ms(t)) for t in self.turns()},
            "ttft_ms_later_turns": percentiles(self.ttfts_ms(after_first=True)),
            "ttft_cpu_ms_by_turn": {
                t: percentiles(self.ttfts_ms(t, cpu=True)) for t in self.turns()
            },
            "ttft_cpu_ms_later_turns": percentiles(self.ttfts_ms(after_first=True, cpu=True)),
            "recomputed_tokens_by_turn": self.recomputed_by_turn(),
            "counters": None
            if self.counters is None
            else {
                **asdict(self.counters),
                "recomputed": self.counters.recomputed,
                "pool_hits": self.counters.pool_hits,
            },
            "records": [asdict(r) for r in self.records],
        }


def percentiles(values: list[float]) -> dict[str, float]:
    """p50 and p99 (nearest rank) of ``values`` (empty: none)."""
    if not values:
        return {}
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {"p50": statistics.median(ordered), "p99": p99}


@dataclass
class KvOffloadReport:
    machine: dict[str, Any]
    config: dict[str, Any]
    settings: list[SettingResult] = field(default_factory=list)
    same_output: bool | None = None  # greedy tokens identical with and without the tier
    vllm: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def setting(self, name: str) -> SettingResult | None:
        return next((s for s in self.settings if s.name == name), None)

    def ratios(self) -> dict[str, float | None]:
        """No tier over tier: TTFT p50/p99 of the later turns, and prompt tokens recomputed."""
        tier, plain = self.setting(TIER), self.setting(NO_TIER)
        if tier is None or plain is None or tier.counters is None or plain.counters is None:
            return {}
        ours, theirs = tier.to_json(), plain.to_json()
        wall, cpu = "ttft_ms_later_turns", "ttft_cpu_ms_later_turns"
        return {
            "ttft_p50": ratio(theirs[wall]["p50"], ours[wall]["p50"]),
            "ttft_p99": ratio(theirs[wall]["p99"], ours[wall]["p99"]),
            "ttft_cpu_p50": ratio(theirs[cpu]["p50"], ours[cpu]["p50"]),
            "ttft_cpu_p99": ratio(theirs[cpu]["p99"], ours[cpu]["p99"]),
            "recomputed_tokens": ratio(plain.counters.recomputed, tier.counters.recomputed),
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "machine": self.machine,
            "config": self.config,
            "settings": [s.to_json() for s in self.settings],
            "ratios_no_tier_over_tier": self.ratios(),
            "same_greedy_output": self.same_output,
            "vllm": self.vllm,
            "notes": self.notes,
        }

    def text(self) -> str:
        rows = []
        for s in self.settings:
            recomputed = s.recomputed_by_turn()
            for turn in s.turns():
                wall, cpu = percentiles(s.ttfts_ms(turn)), percentiles(s.ttfts_ms(turn, cpu=True))
                cells = [wall["p50"], wall["p99"], cpu["p50"], cpu["p99"]]
                rows.append(
                    [s.name, str(turn), *(f"{c:.0f}" for c in cells), str(recomputed[turn])]
                )
        headers = ["setting", "turn", "TTFT p50 ms", "p99", "CPU-s TTFT p50 ms", "p99"]
        lines = [table([*headers, "recomputed"], rows)]
        lines.append("(later turns = every turn after the first; ratios over those)")
        lines += [self._counter_line(s) for s in self.settings if s.counters is not None]
        lines += [f"{k} (no tier / tier): {_x(v)}" for k, v in self.ratios().items()]
        lines.append(f"greedy output identical with and without the tier: {self.same_output}")
        lines.append(f"vLLM: {self.vllm.get('outcome', 'not run')}")
        lines += [f"note: {note}" for note in self.notes]
        return "\n".join(lines)

    @staticmethod
    def _counter_line(s: SettingResult) -> str:
        c = s.counters
        assert c is not None
        return (
            f"{s.name}: prompt tokens {c.prompt_tokens}, recomputed {c.recomputed}, pool hits "
            f"{c.pool_hits}, tier hits {c.tier_hits} ({c.tier_loaded_blocks} blocks loaded, "
            f"{c.tier_stored_blocks} saved); wall {s.wall_s:.1f} s, cpu {s.cpu_s:.1f} s"
        )

    def draw(self, plt: Any) -> Any:
        figure, (wall, cpu, tokens) = plt.subplots(1, 3, figsize=(15, 4))
        width = 0.8 / max(1, len(self.settings))
        for index, s in enumerate(self.settings):
            turns = s.turns()
            xs = [t + (index - (len(self.settings) - 1) / 2) * width for t in turns]
            for axes, on_cpu in ((wall, False), (cpu, True)):
                p = [percentiles(s.ttfts_ms(t, cpu=on_cpu)) for t in turns]
                axes.bar(xs, [q["p50"] for q in p], width, label=s.name)
                axes.scatter(xs, [q["p99"] for q in p], marker="_", s=200, color="black")
            recomputed = s.recomputed_by_turn()
            tokens.bar(xs, [recomputed[t] for t in turns], width, label=s.name)
        wall.set(title="TTFT, wall (bar p50, dash p99)", xlabel="turn", ylabel="ms")
        cpu.set(title="CPU seconds to first token (p50, p99)", xlabel="turn", ylabel="ms")
        tokens.set(title="prompt tokens recomputed", xlabel="turn", ylabel="tokens")
        turns = sorted({t for s in self.settings for t in s.turns()})
        for axes in (wall, cpu, tokens):
            axes.set_xticks(turns)
            axes.legend()
        return figure


def _x(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"
