"""``--compilation-config`` / ``-cc`` and ``-O``: how the model runs, in vLLM's spelling.

``cudagraph_mode`` as vLLM's: ``FULL_DECODE_ONLY`` captures graphs of uniform decode steps
(every sequence of the step decodes or verifies proposals; the batch padded up to the
nearest capture size replays the graph of that size, attention included); ``PIECEWISE``
captures every step up to the largest capture size in tokens as graphs cut at each
attention call, attention running eagerly between them (``piecewise_graphs``: prefill and
mixed steps); ``FULL_AND_PIECEWISE`` (the default, as vLLM's) takes the decode graph for a
decode step and the pieces for the others. Steps past the largest capture size run
eagerly. ``FULL`` reads as ``FULL_AND_PIECEWISE`` (no graph holds a whole mixed step).
``--enforce-eager`` (or ``cudagraph_mode`` ``NONE``) turns graphs off. On CPU the decode
graphs are recorded op calls (``cpu_graphs``) and no step is cut into pieces; they are
recorded at start-up, or at each batch size's first use with ``OCTAVO_CPU_GRAPHS=first-use``.

The optimization level (vLLM 0.32's ``-O`` / ``--optimization-level``, also the ``level``
key) fills what is not given: ``0`` runs eagerly (no graphs, nothing compiled), ``1``
takes ``PIECEWISE`` graphs, ``2`` (the default) and ``3`` ``FULL_AND_PIECEWISE``. ``mode``
is vLLM's compilation mode, which only decides torch.compile of the layers (``0``: never;
``compiled_model.py``); a given ``cudagraph_mode`` wins over the level, as in vLLM.

Accepted forms, as vLLM's: a level (``-O0`` .. ``-O3``), a JSON object
(``{"cudagraph_mode": "FULL_DECODE_ONLY", "cudagraph_capture_sizes": [1, 2, 4]}``, also
as dotted flags: ``-cc.cudagraph_mode=FULL_DECODE_ONLY``, see ``cli_spellings.py``) or a
dict from ``LLM(compilation_config=...)``; the sizes also as their own flags
(``--cudagraph-capture-sizes``, ``--max-cudagraph-capture-size``: ``with_flags``). Keys
Octavo does not act on are refused by name rather than silently ignored.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

GRAPH_MODES = ("NONE", "FULL_DECODE_ONLY", "PIECEWISE", "FULL_AND_PIECEWISE")
MODE_ALIASES = {"FULL": "FULL_AND_PIECEWISE"}  # no graph holds a whole mixed step
LEVELS = (0, 1, 2, 3)
DEFAULT_LEVEL = 2  # vLLM 0.32's default optimization level (3 is the same)
LEVEL_GRAPH_MODES = ("NONE", "PIECEWISE", "FULL_AND_PIECEWISE", "FULL_AND_PIECEWISE")
KNOWN_KEYS = (
    "level",
    "mode",
    "cudagraph_mode",
    "cudagraph_capture_sizes",
    "max_cudagraph_capture_size",
    "backend",
)
CPU_GRAPHS_ENV = "OCTAVO_CPU_GRAPHS"  # when CPU decode graphs are recorded
CPU_GRAPH_TIMES = ("start-up", "first-use")
BACKENDS = ("inductor", "eager")  # torch.compile of the CPU layers, or none
LARGEST_DEFAULT_SIZE = 512  # vLLM's cap on the default capture sizes
# On CPU past a few dozen rows a step's kernels outweigh its host overhead (~5 ms of a
# 64-row SmolLM2 step's ~70), and each size costs start-up time (a few forwards): up to 64
# rows, in steps of 16 past 16. A padded row attends to one slot but costs the linears
# (compute-bound past a few rows: ~0.3 ms a row for SmolLM2 on 2 Xeon vCPUs), so powers of
# two (33 rows padded to 64) cost more; steps of 8 cost 4.3 s of capture instead of 2.6.
LARGEST_CPU_DEFAULT_SIZE = 64
EVERY_SIZE_UP_TO = 32  # --performance-mode interactivity: no padding below (vLLM's)


@dataclass(frozen=True)
class CompilationConfig:
    """What was given; ``None``: not given, the level (or the engine) decides."""

    level: int | None = None  # the optimization level; None: DEFAULT_LEVEL
    cudagraph_mode: str | None = None  # None: the level's (LEVEL_GRAPH_MODES)
    cudagraph_capture_sizes: tuple[int, ...] | None = None  # None: the default ladder
    max_cudagraph_capture_size: int | None = None  # None: from max_num_seqs
    backend: str | None = None  # CPU layers: "inductor" compiles, "eager" not; None: default
    mode: int | None = None  # vLLM's compilation mode; None: 0 at level 0, else 3

    @property
    def optimization_level(self) -> int:
        return DEFAULT_LEVEL if self.level is None else self.level

    @property
    def graph_mode(self) -> str:
        """``cudagraph_mode`` as given, else the optimization level's."""
        return self.cudagraph_mode or LEVEL_GRAPH_MODES[self.optimization_level]

    @property
    def compile_mode(self) -> int:
        """vLLM's compilation mode: as given, else none at level 0 and its own above."""
        if self.mode is not None:
            return self.mode
        return 0 if self.optimization_level == 0 else 3

    @property
    def uses_graphs(self) -> bool:
        return self.graph_mode != "NONE"

    @property
    def full_decode_graphs(self) -> bool:
        """Decode steps replay whole graphs (attention included)."""
        return self.graph_mode in ("FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")

    @property
    def piecewise_graphs(self) -> bool:
        """Steps no whole graph serves replay graphs cut at attention (``piecewise_graphs``)."""
        return self.graph_mode in ("PIECEWISE", "FULL_AND_PIECEWISE")

    def capture_sizes(
        self, max_decode_rows: int, device_type: str = "cuda", every_small_size: bool = False
    ) -> list[int]:
        """The batch sizes captured, ascending: the configured ones, or vLLM's ladder
        ``1, 2, 4, 8, 16, ..., 248, 256, 272, ...`` up to ``max_cudagraph_capture_size``
        (default: the most decode rows a step can have, at most 512); on CPU ``1, 2, 4, 8``
        then steps of 16, by default up to 64. ``every_small_size`` (``--performance-mode
        interactivity``): every size up to 32 too, as vLLM takes them."""
        if self.cudagraph_capture_sizes is not None:
            return sorted(set(self.cudagraph_capture_sizes))
        cpu = device_type == "cpu"
        largest = self.max_cudagraph_capture_size
        if largest is None:
            default = LARGEST_CPU_DEFAULT_SIZE if cpu else LARGEST_DEFAULT_SIZE
            largest = min(max_decode_rows, default)
        ladder = [1, 2, 4, *range(8, 256, 8), *range(256, largest + 16, 16)]
        if cpu:
            ladder = [1, 2, 4, 8, *range(16, largest + 16, 16)]
        if every_small_size:
            ladder = sorted({*range(1, EVERY_SIZE_UP_TO + 1), *ladder})
        sizes = [size for size in ladder if size <= largest]
        if largest not in sizes:  # the largest batch a step can reach gets its own graph
            sizes.append(largest)
        return sizes


def cpu_graphs_at_first_use() -> bool:
    """``$OCTAVO_CPU_GRAPHS``: ``start-up`` (the default) records every CPU decode graph
    before the first request; ``first-use`` records each size at the first step that needs
    it (a faster start; that step pays the recording)."""
    value = os.environ.get(CPU_GRAPHS_ENV, CPU_GRAPH_TIMES[0])
    if value not in CPU_GRAPH_TIMES:
        raise ValueError(f"${CPU_GRAPHS_ENV} is {value!r}: one of {', '.join(CPU_GRAPH_TIMES)}")
    return value == "first-use"


def parse_compilation_config(value: Any) -> CompilationConfig:
    """``-O3``'s ``"3"``, a level, a JSON object, a dict or a ``CompilationConfig``."""
    if value is None or isinstance(value, CompilationConfig):
        return value or CompilationConfig()
    if isinstance(value, int) and not isinstance(value, bool):
        return _checked({"level": value})
    if isinstance(value, str):
        text = value.strip()
        if text.isdigit():
            return _checked({"level": int(text)})
        try:
            value = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(
                f"--compilation-config must be a level 0-3 or a JSON object: {error}"
            ) from None
    if not isinstance(value, dict):
        raise ValueError("--compilation-config must be a level 0-3 or a JSON object")
    return _checked(value)


def with_flags(
    config: CompilationConfig,
    optimization_level: int | None = None,
    capture_sizes: list[int] | tuple[int, ...] | None = None,
    max_capture_size: int | None = None,
) -> CompilationConfig:
    """``config`` with vLLM's top-level flags for its keys (``--optimization-level`` /
    ``-O``, ``--cudagraph-capture-sizes``, ``--max-cudagraph-capture-size``); a key given
    both ways is refused, as vLLM refuses it."""
    given = {
        "level": optimization_level,
        "cudagraph_capture_sizes": None if capture_sizes is None else tuple(capture_sizes),
        "max_cudagraph_capture_size": max_capture_size,
    }
    given = {key: value for key, value in given.items() if value is not None}
    for key in given:
        if getattr(config, key) is not None:
            flag = FLAG_OF_KEY[key]
            raise ValueError(
                f"{flag} and compilation_config.{key} are mutually exclusive: give one"
            )
    raw = {key: value for key, value in vars(config).items() if value is not None}
    return _checked({**raw, **given}) if given else config


FLAG_OF_KEY = {
    "level": "--optimization-level (-O)",
    "cudagraph_capture_sizes": "--cudagraph-capture-sizes",
    "max_cudagraph_capture_size": "--max-cudagraph-capture-size",
}


def _checked(raw: dict) -> CompilationConfig:
    unknown = sorted(set(raw) - set(KNOWN_KEYS))
    if unknown:
        raise ValueError(
            f"--compilation-config: unsupported keys {', '.join(unknown)} "
            f"(supported: {', '.join(KNOWN_KEYS)})"
        )
    level, mode = raw.get("level"), raw.get("mode")
    for name, value in (("level", level), ("mode", mode)):
        if value is not None and (isinstance(value, bool) or value not in LEVELS):
            raise ValueError(f"--compilation-config: {name} must be 0-3, got {value!r}")
    sizes = raw.get("cudagraph_capture_sizes")
    largest = raw.get("max_cudagraph_capture_size")
    checks = (("cudagraph_capture_sizes", sizes), ("max_cudagraph_capture_size", [largest]))
    for name, numbers in checks:
        if numbers is not None and not all(n is None or _positive(n) for n in numbers):
            raise ValueError(f"--compilation-config: {name} must be positive integers")
    sizes = None if sizes is None else tuple(sizes)
    graph_mode = _graph_mode(raw.get("cudagraph_mode"))
    return CompilationConfig(level, graph_mode, sizes, largest, _backend(raw.get("backend")), mode)


def _graph_mode(value: Any) -> str | None:
    if value is None:
        return None
    mode = str(value).upper()
    mode = MODE_ALIASES.get(mode, mode)
    if mode not in GRAPH_MODES:
        raise ValueError(
            f"--compilation-config: cudagraph_mode must be one of "
            f"{', '.join(GRAPH_MODES + tuple(MODE_ALIASES))}, got {mode!r}"
        )
    return mode


def _backend(value: Any) -> str | None:
    if value is not None and value not in BACKENDS:
        choices = ", ".join(BACKENDS)
        raise ValueError(f"--compilation-config: backend must be one of {choices}, got {value!r}")
    return value


def _positive(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0
