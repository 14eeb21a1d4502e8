"""Pacing for the replay socket, which anyone who can reach its port may call: a token
bucket for the requests it answers, and warnings at most once per interval with a count.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class TokenBucket:
    """``rate`` tokens a second up to ``burst``; ``take`` spends one if there is one."""

    rate: float
    burst: float
    clock: Callable[[], float] = time.monotonic
    _tokens: float = field(init=False)
    _last: float = field(init=False)

    def __post_init__(self) -> None:
        self._tokens, self._last = self.burst, self.clock()

    def take(self) -> bool:
        now = self.clock()
        self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
        self._last = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True


@dataclass
class ThrottledWarning:
    """Logs ``message % count`` at most once per ``interval`` seconds, counting the
    occurrences in between (the first one is logged at once)."""

    logger: logging.Logger
    message: str  # with one %d: how many times it happened since the last line
    interval: float = 60.0
    clock: Callable[[], float] = time.monotonic
    _pending: int = field(default=0, init=False)
    _last: float | None = field(default=None, init=False)

    def note(self) -> None:
        self._pending += 1
        now = self.clock()
        if self._last is None or now - self._last >= self.interval:
            self.logger.warning(self.message, self._pending)
            self._pending, self._last = 0, now
