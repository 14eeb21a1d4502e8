"""The output file: what earlier runs wrote (to resume), durable appends, the atomic finish.

Results are appended as whole lines and fsynced before they count as written, so a crash
loses at most the lines in flight; a torn last line is dropped and its request redone.
With ``--output-tmp-dir`` the lines go to a working file there (named after the output's
absolute path, so a rerun finds it) that is renamed onto the output when the batch is done.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import shutil
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger(__name__)


@dataclass
class Existing:
    """What an earlier run left: result lines per ``custom_id``, and the length of the
    complete lines at the file's start (anything after them is a torn write)."""

    done: Counter[str] = field(default_factory=Counter)
    keep_bytes: int = 0


def read_existing(path: Path) -> Existing:
    """The result lines already in ``path``; ValueError if an unreadable line is followed by
    readable ones (not a torn write: the file was edited or is not a batch output)."""
    existing, unreadable_at, offset = Existing(), None, 0
    if not path.exists():
        return existing
    with path.open("rb") as file:
        for number, raw in enumerate(file, 1):
            offset += len(raw)
            custom_id = result_custom_id(raw)
            if custom_id is None:
                unreadable_at = unreadable_at or number
                continue
            if unreadable_at is not None:
                raise ValueError(
                    f"line {unreadable_at} of {path} is not a batch result line; "
                    "remove it (or the file) to rerun"
                )
            existing.done[custom_id] += 1
            existing.keep_bytes = offset
    if offset > existing.keep_bytes:
        logger.warning("dropping a torn last line of %s (a crash mid-write)", path)
    return existing


def result_custom_id(raw: bytes) -> str | None:
    """The ``custom_id`` of a complete output line (None: torn or not a result line)."""
    if not raw.endswith(b"\n"):
        return None
    try:
        record = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(record, dict) or "response" not in record:
        return None
    custom_id = record.get("custom_id")
    return custom_id if isinstance(custom_id, str) else None


class DurableAppender:
    """Appends whole lines to a file and fsyncs them; concurrent ``append`` calls share
    one write and one fsync (group commit). Holds an exclusive lock on the file so two
    runs never write one output."""

    def __init__(self, path: Path) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
        self._fd = os.open(path, flags, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._fd)
            raise ValueError(f"another octavo run-batch is writing {path}") from None
        fsync_directory(path.parent)
        self._pending: list[bytes] = []
        self._lock = asyncio.Lock()  # one group write at a time
        self._io_lock = threading.Lock()  # a cancelled write's thread finishes before close
        self.lines_written = 0

    def truncate(self, keep_bytes: int) -> None:
        """Drop what follows the complete lines (a torn write), before appending."""
        os.ftruncate(self._fd, keep_bytes)

    async def append(self, line: bytes) -> None:
        """Returns once ``line`` is on disk."""
        self._pending.append(line)
        async with self._lock:
            if not self._pending:  # an earlier holder wrote it
                return
            chunk, count = b"".join(self._pending), len(self._pending)
            self._pending = []
            await asyncio.to_thread(self._write, chunk)
            self.lines_written += count

    def _write(self, chunk: bytes) -> None:
        with self._io_lock:
            if self._fd < 0:  # closed under a cancelled run: these lines are redone
                return
            view = memoryview(chunk)
            while view:
                view = view[os.write(self._fd, view) :]
            os.fsync(self._fd)

    def close(self) -> None:
        with self._io_lock:
            os.close(self._fd)
            self._fd = -1


def working_path(output: Path, tmp_dir: Path | None) -> Path:
    """Where the lines are written: the output itself, or a file in ``tmp_dir`` named after
    the output's absolute path."""
    if tmp_dir is None:
        return output
    digest = hashlib.sha256(str(output.resolve()).encode()).hexdigest()[:16]
    return tmp_dir / f"{output.name}.{digest}.partial"


def seed_working_file(output: Path, working: Path) -> None:
    """A first run with ``--output-tmp-dir`` over an existing output resumes from it."""
    if working != output and not working.exists() and output.exists():
        shutil.copyfile(output, working)


def publish(working: Path, output: Path) -> None:
    """Move the finished working file onto the output atomically (across file systems:
    copied next to the output first)."""
    if working == output:
        return
    try:
        os.replace(working, output)
    except OSError as error:
        if error.errno != errno.EXDEV:
            raise
        staged = output.with_name(f".{output.name}.{os.getpid()}.tmp")
        shutil.copyfile(working, staged)
        with staged.open("rb") as file:
            os.fsync(file.fileno())
        os.replace(staged, output)
        working.unlink()
    fsync_directory(output.parent)


def fsync_directory(folder: Path) -> None:
    """Make a file's creation or rename durable (where the platform allows)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
