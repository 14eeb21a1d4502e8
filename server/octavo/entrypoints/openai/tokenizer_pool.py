"""Tokenizing and chat templates off the event loop, in a small pool of threads.

A fast tokenizer's ``encode_batch`` releases the GIL while it works (``prompts.py`` uses
it for every text), so a long prompt no longer holds up ``/health`` or other requests;
jinja templates are Python and give the GIL back every few milliseconds.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")
TOKENIZER_THREADS = 2


class TokenizerPool:
    """``await pool.run(function, *args)`` runs ``function`` in one of a few threads."""

    def __init__(self, threads: int = TOKENIZER_THREADS) -> None:
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="octavo-tokenize")

    async def run(self, function: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(function, *args))

    def shutdown(self) -> None:
        """Drop queued work; a call already running finishes in the background."""
        self._executor.shutdown(wait=False, cancel_futures=True)
