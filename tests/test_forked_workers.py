"""Rank processes forked by the worker zygote (``executor/forked_workers.py``): what the
executor reads of them as it would of a spawned ``subprocess.Popen``, and nothing left
behind when the engine's process dies. The engines that run on forked ranks (every
tensor- and pipeline-parallel test) check the rest."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from multiprocessing.connection import Connection

import psutil
import pytest

from octavo.executor import forked_workers
from octavo.executor.forked_workers import METHOD_ENV, ForkedWorker, start_worker_process
from octavo.worker.worker import STOP_WORKER

ENGINE_SCRIPT = """
import socket, sys, time
from octavo.executor.forked_workers import start_worker_process
ours, theirs = socket.socketpair()
with theirs:
    rank = start_worker_process(theirs)
print(rank.pid, flush=True)
time.sleep(120)
"""


def fork_rank() -> tuple[ForkedWorker, Connection]:
    ours, theirs = socket.socketpair()
    with theirs:
        rank = start_worker_process(theirs)
    assert isinstance(rank, ForkedWorker)
    return rank, Connection(ours.detach())


def test_a_stopped_rank_exits_zero_and_a_killed_one_reports_the_signal():
    stopped, conn = fork_rank()
    killed, _ = fork_rank()
    assert stopped.poll() is None and killed.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        killed.wait(timeout=0.2)
    conn.send(STOP_WORKER)  # before it was given a rank: it leaves at once
    assert stopped.wait(timeout=30) == 0 and stopped.returncode == 0
    killed.kill()
    assert killed.wait(timeout=30) == -signal.SIGKILL and killed.poll() == -signal.SIGKILL
    assert not psutil.pid_exists(killed.pid)  # reaped by the zygote before it reported


def test_ranks_and_their_zygote_die_with_the_engines_process():
    engine = subprocess.Popen(
        [sys.executable, "-c", ENGINE_SCRIPT], stdout=subprocess.PIPE, text=True
    )
    try:
        rank = psutil.Process(int(engine.stdout.readline()))
        zygote = rank.parent()
        assert zygote.ppid() == engine.pid
    finally:
        engine.kill()
        engine.wait()
    deadline = time.monotonic() + 10
    while any(_alive(process) for process in (rank, zygote)):
        assert time.monotonic() < deadline, "a rank or the zygote outlived the engine"
        time.sleep(0.05)


def test_spawn_starts_a_fresh_interpreter_and_other_methods_are_refused(monkeypatch):
    monkeypatch.setenv(METHOD_ENV, "spawn")
    ours, theirs = socket.socketpair()
    with theirs:
        rank = start_worker_process(theirs)
    assert isinstance(rank, subprocess.Popen)
    assert "octavo.worker.worker_process" in " ".join(rank.args)
    Connection(ours.detach()).send(STOP_WORKER)
    assert rank.wait(timeout=60) == 0
    monkeypatch.setenv(METHOD_ENV, "forkserver")
    with pytest.raises(ValueError, match="expected one of fork, spawn"):
        start_worker_process(socket.socket())


def test_a_dead_zygote_is_replaced_and_its_ranks_read_as_killed():
    rank, _ = fork_rank()
    first = forked_workers.zygote()
    os.kill(first._process.pid, signal.SIGKILL)  # its ranks die with it
    assert rank.wait(timeout=30) == forked_workers.LOST_WITH_ZYGOTE
    again, conn = fork_rank()
    assert forked_workers.zygote() is not first
    conn.send(STOP_WORKER)
    assert again.wait(timeout=30) == 0


def _alive(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_hosts_with_cuda_devices_spawn_by_default(monkeypatch):
    """A forked rank must never inherit an initialized CUDA driver: GPU hosts spawn."""
    import torch

    monkeypatch.delenv(METHOD_ENV, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert forked_workers.default_method() == "spawn"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert forked_workers.default_method() == "fork"
