"""The ``pd`` benchmark's results: short-chat ITL and TTFT, long-prompt TTFT, the KV
transfer cost per block, and the multi-machine case modelled from them; text, JSON, PNG."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from octavo_bench.pd_proxy import Sent
from octavo_bench.pd_workload import LONG, SHORT
from octavo_bench.report import ratio, table
from octavo_bench.serve_metrics import percentile

COLOCATED = "co-located"
NETWORKS_GBPS = (25, 100, 400)


@dataclass
class Transfers:
    """The decode server's KV pulls over one setup (differences of its counters)."""

    seconds: float
    bytes: float
    ok: float
    failed: float
    tokens_received: float  # vllm:prompt_tokens_by_source{source="external_kv_transfer"}
    tokens_computed: float  # ...{source="local_compute"}
    block_bytes: int

    @property
    def blocks(self) -> float:
        return self.bytes / self.block_bytes

    @property
    def seconds_per_block(self) -> float | None:
        return self.seconds / self.blocks if self.blocks else None


@dataclass
class SetupResult:
    name: str
    servers: list[str]  # what each process did, in order
    sent: list[Sent]
    duration_s: float
    server_cpu_s: list[float]  # user + sys of each server's processes over the run
    transfers: Transfers | None = None  # during the timed run
    idle_transfers: Transfers | None = None  # long prompts split one at a time afterwards

    def values(self, kind: str, what: str) -> list[float]:
        done = [s.record for s in self.sent if s.kind == kind and s.record.success]
        if what == "itl":
            return [gap for record in done for gap in record.itls]
        return [getattr(record, what) for record in done]

    def ms(self, kind: str, what: str, q: float) -> float | None:
        values = self.values(kind, what)
        return 1000 * percentile(values, q) if values else None

    def figures(self) -> dict[str, float | None]:
        return {
            "short_itl_p50_ms": self.ms(SHORT, "itl", 50),
            "short_itl_p99_ms": self.ms(SHORT, "itl", 99),
            "short_itl_p99.9_ms": self.ms(SHORT, "itl", 99.9),
            "short_ttft_p50_ms": self.ms(SHORT, "ttft", 50),
            "short_ttft_p99_ms": self.ms(SHORT, "ttft", 99),
            "long_ttft_p50_ms": self.ms(LONG, "ttft", 50),
            "long_ttft_p99_ms": self.ms(LONG, "ttft", 99),
        }

    def failed(self) -> list[str]:
        return [s.record.error for s in self.sent if not s.record.success]

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "servers": self.servers,
            "duration_s": self.duration_s,
            "server_cpu_s": self.server_cpu_s,
            "figures": self.figures(),
            "failed": len(self.failed()),
            "errors": sorted(set(self.failed()))[:5],
            "transfers": _transfers_json(self.transfers),
            "idle_transfers": _transfers_json(self.idle_transfers),
            "requests": [
                {"kind": s.kind, "split": s.split, "prefill_s": s.prefill_s, **s.record.to_json()}
                for s in self.sent
            ],
        }


@dataclass
class PdReport:
    machine: dict[str, Any]
    config: dict[str, Any]
    setups: list[SetupResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def setup(self, name: str) -> SetupResult | None:
        return next((s for s in self.setups if s.name == name), None)

    def ratios(self) -> dict[str, dict[str, float | None]]:
        """Co-located over each P/D setup, figure by figure (above 1: P/D is faster)."""
        base = self.setup(COLOCATED)
        if base is None:
            return {}
        ours = base.figures()
        return {
            s.name: {k: _ratio(ours[k], v) for k, v in s.figures().items()}
            for s in self.setups
            if s.name != COLOCATED
        }

    def transfer_cost(self) -> Transfers | None:
        """The pulls the per-block figures come from: the idle ones (long prompts alone)
        where measured, else the run's with the most blocks a pull."""
        idle = [s.idle_transfers for s in self.setups if s.idle_transfers and s.idle_transfers.ok]
        measured = idle or [s.transfers for s in self.setups if s.transfers and s.transfers.ok]
        return max(measured, key=lambda t: t.blocks / t.ok, default=None)

    def to_json(self) -> dict[str, Any]:
        return {
            "benchmark": "pd",
            "machine": self.machine,
            "config": self.config,
            "setups": [s.to_json() for s in self.setups],
            "ratios_colocated_over_pd": self.ratios(),
            "multi_machine_model": self.model_paragraph(),
            "notes": self.notes,
        }

    def text(self) -> str:
        headers = ["setup", "short ITL p50 ms", "p99", "p99.9", "short TTFT p50", "p99"]
        headers += ["long TTFT p50", "p99", "failed", "server CPU s"]
        rows = []
        for s in self.setups:
            cells = [_ms(v) for v in s.figures().values()]
            cpu = "/".join(f"{c:.0f}" for c in s.server_cpu_s)
            rows.append([s.name, *cells, str(len(s.failed())), cpu])
        lines = [table(headers, rows)]
        for name, figures in self.ratios().items():
            shown = ", ".join(f"{k} {_x(v)}" for k, v in figures.items())
            lines.append(f"co-located / {name}: {shown}")
        for s in self.setups:
            if s.transfers is not None:
                lines.append(f"{s.name}, during the run: {_transfer_line(s.transfers)}")
            if s.idle_transfers is not None:
                lines.append(f"{s.name}, idle: {_transfer_line(s.idle_transfers)}")
        lines += ["", self.model_paragraph(), *(f"note: {n}" for n in self.notes)]
        return "\n".join(lines)

    def model_paragraph(self) -> str:
        return multi_machine_model(self)

    def draw(self, plt: Any) -> Any:
        figure, axes = plt.subplots(1, 3, figsize=(15, 4))  # p50 and p99 of each
        names = [s.name for s in self.setups]
        panels = [
            ("short chats: ITL (ms)", "short_itl"),
            ("short chats: TTFT (ms)", "short_ttft"),
            ("long prompts: TTFT (ms)", "long_ttft"),
        ]
        for ax, (title, key) in zip(axes, panels, strict=True):
            for offset, q in ((-0.2, "p50"), (0.2, "p99")):
                values = [s.figures()[f"{key}_{q}_ms"] or 0.0 for s in self.setups]
                ax.bar([i + offset for i in range(len(names))], values, 0.4, label=q)
            ax.set_xticks(range(len(names)), names)
            ax.set_title(title)
            ax.legend()
        return figure


def multi_machine_model(report: PdReport) -> str:
    """The multi-machine case on paper, from this run's figures."""
    base, cost = report.setup(COLOCATED), report.transfer_cost()
    split = next((s for s in report.setups if s.name != COLOCATED), None)
    if base is None or split is None or cost is None or cost.seconds_per_block is None:
        return "multi-machine model: needs the co-located run and a P/D run with transfers"
    ours, theirs = base.figures(), split.figures()
    co_p99, pd_p99 = _ms(ours["short_itl_p99_ms"]), _ms(theirs["short_itl_p99_ms"])
    return (
        "Multi-machine model (each server on its own machine): co-located, a server's decode "
        "steps share the step with the chunks of the long prefills it is given, so the short "
        f"chats' ITL p99 stays near the {co_p99} ms measured here "
        "(each server pinned to a core of its own, roughly a machine each); with P/D the "
        f"decode server never computes a long prompt: its ITL p99, {pd_p99} ms here "
        f"({split.name}), is what the chats would see. " + transfer_model(report, cost)
    )


def transfer_model(report: PdReport, cost: Transfers) -> str:
    """What moving a long prompt's blocks adds to its TTFT, on loopback and on a network."""
    assert cost.seconds_per_block is not None
    long_tokens = int(report.config["long_prompt_words"])
    blocks = -(-long_tokens // int(report.config["block_size"]))
    megabytes = blocks * cost.block_bytes / 1e6
    wire = ", ".join(f"{gbps} Gb/s {megabytes * 8 / gbps:.1f} ms" for gbps in NETWORKS_GBPS)
    busy = [s.transfers for s in report.setups if s.transfers and s.transfers.seconds_per_block]
    loaded = max((t.seconds_per_block or 0.0 for t in busy), default=0.0)
    return (
        f"The price is on TTFT: a {long_tokens}-token prompt is {blocks} blocks of "
        f"{cost.block_bytes / 1e3:.0f} kB ({megabytes:.1f} MB); pulled over loopback TCP from "
        f"an idle prefill server at the measured {1000 * cost.seconds_per_block:.2f} ms a "
        f"block that adds {1000 * cost.seconds_per_block * blocks:.0f} ms, and the bytes "
        f"alone take {wire} on the wire (bytes x 8 / link rate; the side channel's round "
        "trips and copies come on top). Under load the pulls took up to "
        f"{1000 * loaded:.2f} ms a block: the prefill server reads blocks on its core thread "
        "between steps, so a pull waits for the step in progress (a 512-token chunk of "
        "another prompt); separate machines keep that wait, only the wire time changes."
    )


def _transfer_line(t: Transfers) -> str:
    per_block = "n/a" if t.seconds_per_block is None else f"{1000 * t.seconds_per_block:.2f}"
    return (
        f"{t.ok:.0f} KV pulls ({t.failed:.0f} failed), {t.blocks:.0f} blocks, "
        f"{t.bytes / 1e6:.1f} MB in {t.seconds:.2f} s = {per_block} ms and "
        f"{t.block_bytes / 1e3:.0f} kB a block; decode server prompt tokens received "
        f"{t.tokens_received:.0f}, computed {t.tokens_computed:.0f}"
    )


def _transfers_json(t: Transfers | None) -> dict[str, Any] | None:
    if t is None:
        return None
    return {**asdict(t), "blocks": t.blocks, "seconds_per_block": t.seconds_per_block}


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    return None if numerator is None or denominator is None else ratio(numerator, denominator)


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f}"


def _x(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"
