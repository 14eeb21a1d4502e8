"""The output file: what earlier runs wrote (to resume), durable appends, the atomic finish.

Results are appended as whole lines and fsynced before they count as written, so a crash
loses at most the lines in flight; a torn last line is dropped and its request redone. A
file that is not a batch output (a line that is not a result line) is refused, never
truncated, and no symbolic link is followed. With ``--output-tmp-dir`` the lines go to a
working file there, created with a random name (``O_EXCL``: nobody can plant it or a link
in its place), that is renamed onto the output when the batch is done; a rerun finds it by
its prefix (named after the output's absolute path), if it is a plain file of this user's.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import glob
import hashlib
import json
import logging
import os
import re
import shutil
import stat
import tempfile
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger(__name__)

WORKING_SUFFIX = ".partial"
PUBLISHED_MODE = 0o644  # the working file is private (0600) until it becomes the output
# How a result line starts (``encode_line``), whitespace aside: a torn last line must too.
_RESULT_START = b'{"id":'
_WHITESPACE = re.compile(rb"\s+")


@dataclass
class Existing:
    """What an earlier run left: result lines per ``custom_id``, and the length of the
    complete lines at the file's start (anything after them is a torn write)."""

    done: Counter[str] = field(default_factory=Counter)
    keep_bytes: int = 0


def check_writable(output: Path, tmp_dir: Path | None) -> None:
    """ValueError (one clear line) unless ``output`` can be appended to, or created, and,
    with ``tmp_dir``, a working file made there and renamed onto ``output``. Nothing is
    written: an existing output is opened for appending and closed, folders get a
    temporary file that is deleted at once."""
    try:
        info = output.lstat()
    except FileNotFoundError:
        info = None
    if info is not None and stat.S_ISLNK(info.st_mode):
        raise ValueError(f"-o {output} is a symbolic link: give the file it points to")
    if info is not None and not stat.S_ISREG(info.st_mode):
        raise ValueError(f"-o {output} is not a regular file")
    if info is not None and tmp_dir is None:  # appended to (else renamed onto)
        flags = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            os.close(os.open(output, flags))
        except OSError as error:
            raise ValueError(f"-o {output}: cannot write it ({error.strerror})") from None
    if info is None or tmp_dir is not None:  # created, or renamed onto: in its folder
        _check_folder_writable(output.parent, "-o")
    if tmp_dir is not None:
        _check_folder_writable(tmp_dir, "--output-tmp-dir")


def _check_folder_writable(folder: Path, flag: str) -> None:
    try:
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as error:
        raise ValueError(f"{flag}: cannot write in {folder} ({error.strerror})") from None


def read_existing(path: Path) -> Existing:
    """The result lines already in ``path``; ValueError if a complete line is not a result
    line, or the unfinished last one does not start as one: the file was edited or is not
    a batch output, and is left as it is."""
    existing, offset = Existing(), 0
    if not path.exists():
        return existing
    with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC), "rb") as file:
        for number, raw in enumerate(file, 1):
            offset += len(raw)
            if raw.endswith(b"\n") and not raw.strip():  # a blank line (an editor's): kept
                existing.keep_bytes = offset
                continue
            custom_id = result_custom_id(raw)
            if custom_id is None and (raw.endswith(b"\n") or not _starts_a_result(raw)):
                raise ValueError(
                    f"line {number} of {path} is not a batch result line: it is not an "
                    "octavo run-batch output; give another -o (or remove the file to start over)"
                )
            if custom_id is not None:
                existing.done[custom_id] += 1
                existing.keep_bytes = offset
    if offset > existing.keep_bytes:
        logger.warning("dropping a torn last line of %s (a crash mid-write)", path)
    return existing


def _starts_a_result(tail: bytes) -> bool:
    """Whether an unfinished last line is the start of a result line (a torn write)."""
    start = _WHITESPACE.sub(b"", tail[: 4 * len(_RESULT_START)])
    return start.startswith(_RESULT_START) or _RESULT_START.startswith(start)


def result_custom_id(raw: bytes) -> str | None:
    """The ``custom_id`` of a complete output line (None: torn or not a result line)."""
    if not raw.endswith(b"\n"):
        return None
    try:
        record = json.loads(raw)
    except (ValueError, RecursionError):  # RecursionError: nested too deeply to parse
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
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW
        try:
            self._fd = os.open(path, flags, 0o644)
        except OSError as error:  # a link (ELOOP), no permission, a read-only file system
            raise ValueError(f"cannot write {path}: {error.strerror}") from None
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


def working_file(output: Path, tmp_dir: Path | None) -> Path:
    """Where the lines are written: the output itself, or (``tmp_dir``) the working file an
    earlier run left there, else a new one holding what the output has (a first run with
    ``--output-tmp-dir`` over an existing output resumes from it)."""
    if tmp_dir is None:
        return output
    found = find_working(output, tmp_dir)
    if found is not None:
        return found
    fd, name = tempfile.mkstemp(  # a random name, O_EXCL, mode 0600
        prefix=working_prefix(output), suffix=WORKING_SUFFIX, dir=tmp_dir
    )
    with os.fdopen(fd, "wb") as working:
        if output.is_file():
            with output.open("rb") as source:
                shutil.copyfileobj(source, working)
    return Path(name)


def working_prefix(output: Path) -> str:
    """How the working files of ``output`` are named (then a random part, ``.partial``)."""
    digest = hashlib.sha256(str(output.resolve()).encode()).hexdigest()[:16]
    return f"{output.name}.{digest}."


def find_working(output: Path, tmp_dir: Path) -> Path | None:
    """The newest working file of ``output`` in ``tmp_dir`` that this user made: a plain
    file (not a link), owned by this user, writable by nobody else; others are ignored."""
    usable = []
    for path in tmp_dir.glob(f"{glob.escape(working_prefix(output))}*{WORKING_SUFFIX}"):
        info = path.lstat()
        ours = stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid()
        if ours and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            usable.append((info.st_mtime, path))
        else:
            logger.warning("ignoring %s: not a plain file of this user's", path)
    return max(usable)[1] if usable else None


def publish(working: Path, output: Path) -> None:
    """Move the finished working file onto the output atomically (across file systems:
    copied next to the output first)."""
    if working == output:
        return
    os.chmod(working, PUBLISHED_MODE)
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
