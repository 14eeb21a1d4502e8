"""Progress of the long start-up phases: download, weight loading, kernel builds, graph capture.

Every phase reports through one ``PhaseReporter``: on a terminal it draws a tqdm bar on
stderr; elsewhere (a pod's log) it writes a log line with the phase, percent and rate every
``LOG_EVERY_SECONDS``, and one when the phase ends, so a log shows the load moving without
a bar's carriage returns. Listeners (``add_listener``) get a ``PhaseProgress`` at most every
``NOTIFY_EVERY_SECONDS``: the engine core forwards them to the API process, whose
``/health`` names the phase and its percent while the model loads.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import IO, Any, TypeVar

from tqdm.auto import tqdm

logger = logging.getLogger(__name__)

LOG_EVERY_SECONDS = 5.0
NOTIFY_EVERY_SECONDS = 0.5
T = TypeVar("T")


@dataclass(frozen=True)
class PhaseProgress:
    """Where one phase stands: picklable, sent from the engine core to the API process."""

    phase: str
    done: float
    total: float | None
    unit: str
    rate: float  # units per second since the phase began
    finished: bool = False

    @property
    def percent(self) -> float | None:
        """0-100, or None when the phase's size is unknown."""
        if not self.total:
            return 100.0 if self.finished else None
        return round(min(100.0, 100.0 * self.done / self.total), 1)

    def describe(self) -> str:
        """One log line: ``loading weights: 42.0% (120 of 291 tensors, 35.2 tensors/s)``."""
        head = f"{self.percent:.1f}%" if self.percent is not None else "running"
        count = _with_unit(self.done, self.unit)
        if self.total:
            done = _with_unit(self.done, self.unit).removesuffix(f" {self.unit}")
            count = f"{done} of {_with_unit(self.total, self.unit)}"
        return f"{self.phase}: {head} ({count}, {_with_unit(self.rate, self.unit)}/s)"


Listener = Callable[[PhaseProgress], None]
_listeners: list[Listener] = []
_listeners_lock = threading.Lock()


def add_listener(listener: Listener) -> None:
    with _listeners_lock:
        _listeners.append(listener)


def remove_listener(listener: Listener) -> None:
    with _listeners_lock:
        if listener in _listeners:
            _listeners.remove(listener)


def is_terminal(stream: IO[str]) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


class PhaseReporter:
    """Counts one phase's work; a bar on a terminal, log lines elsewhere (see the module).

    ``show_bar=False``: someone else draws the bar (a library's own tqdm); only the log
    lines (off a terminal) and the listeners are served.
    """

    def __init__(
        self,
        phase: str,
        total: float | None = None,
        unit: str = "it",
        *,
        stream: IO[str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        show_bar: bool = True,
    ) -> None:
        self.phase, self.total, self.unit, self.done = phase, total, unit, 0.0
        self._stream = stream or sys.stderr
        self._terminal = is_terminal(self._stream)
        self._clock = clock
        self._start = self._last_log = self._last_notify = clock()
        self._bar = None
        if self._terminal and show_bar:
            scale = unit == "B"
            self._bar = tqdm(
                total=total, desc=phase, unit=unit, unit_scale=scale, file=self._stream
            )
        self._closed = False
        self._lock = threading.Lock()  # a download's threads all update one reporter
        _notify(self.snapshot())

    def update(self, amount: float = 1) -> None:
        with self._lock:
            self.done += amount
            if self._bar is not None:
                self._bar.update(amount)
            now = self._clock()
            log = not self._terminal and now - self._last_log >= LOG_EVERY_SECONDS
            notify = now - self._last_notify >= NOTIFY_EVERY_SECONDS
            self._last_log = now if log else self._last_log
            self._last_notify = now if notify else self._last_notify
        if log:
            logger.info("%s", self.snapshot().describe())
        if notify:
            _notify(self.snapshot())

    def set_total(self, total: float | None) -> None:
        self.total = total
        if self._bar is not None:
            self._bar.total = total
            self._bar.refresh()

    def snapshot(self, finished: bool = False) -> PhaseProgress:
        elapsed = self._clock() - self._start
        rate = self.done / elapsed if elapsed > 0 else 0.0
        return PhaseProgress(self.phase, self.done, self.total, self.unit, rate, finished)

    def close(self) -> None:
        """End the phase: the bar closes, or a last log line with the time it took."""
        if self._closed:
            return
        self._closed = True
        if self._bar is not None:
            self._bar.close()
        final = self.snapshot(finished=True)
        if not self._terminal:
            seconds = self._clock() - self._start
            done = _with_unit(final.done, self.unit)
            logger.info("%s: done, %s in %.1f s", self.phase, done, seconds)
        _notify(final)

    def __enter__(self) -> PhaseReporter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def track(
    items: Iterable[T], phase: str, total: float | None = None, unit: str = "it"
) -> Iterator[T]:
    """``items``, reporting one unit of ``phase`` per item (``total``: ``len(items)``)."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    with PhaseReporter(phase, total, unit) as reporter:
        for item in items:
            yield item
            reporter.update()


class DownloadBar(tqdm):
    """A tqdm for libraries that take a ``tqdm_class`` (huggingface_hub's snapshot_download).

    The library draws its bars on a terminal (hidden elsewhere); its byte bar also feeds a
    ``PhaseReporter`` named ``phase`` for the log lines and ``/health``.
    """

    phase = "downloading model"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["disable"] = kwargs.get("disable", False) or not is_terminal(sys.stderr)
        super().__init__(*args, **kwargs)
        self._reporter: PhaseReporter | None = None
        desc = str(kwargs.get("desc") or "")
        if kwargs.get("unit") == "B" and not desc.startswith("Downloading bytes"):
            self._reporter = PhaseReporter(
                self.phase, kwargs.get("total") or None, "B", show_bar=False
            )

    def update(self, n: float | None = 1) -> bool | None:
        if self._reporter is not None:
            self._reporter.total = self.total or None
            self._reporter.update(n or 0)
        return super().update(n)

    def close(self) -> None:
        if getattr(self, "_reporter", None) is not None:
            self._reporter.close()
        super().close()


def _notify(progress: PhaseProgress) -> None:
    with _listeners_lock:
        listeners = list(_listeners)
    for listener in listeners:
        try:
            listener(progress)
        except Exception:  # a progress report must never break the work it reports
            logger.exception("a progress listener failed")


def _with_unit(value: float, unit: str) -> str:
    """``1.5 GiB``, ``291 tensors``, ``35.2 tensors``."""
    if unit == "B":
        for scale, prefix in ((2**30, "Gi"), (2**20, "Mi"), (2**10, "Ki")):
            if value >= scale:
                return f"{value / scale:.1f} {prefix}B"
        return f"{value:.0f} B"
    number = f"{int(value)}" if value == int(value) else f"{value:.1f}"
    return f"{number} {unit}"
