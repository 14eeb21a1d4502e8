"""Finding an engine's rank processes in the process tree, as ``ps`` shows them.

A rank is spawned (``python -m octavo.worker.worker_process`` on the engine's host,
``octavo.worker.remote_entry`` on a worker host) or forked by the worker zygote
(``octavo.worker.worker_zygote``, the default): a forked rank has the zygote's command
line, and the zygote for parent.
"""

from __future__ import annotations

import psutil

SPAWNED_RANK_MODULES = ("octavo.worker.worker_process", "octavo.worker.remote_entry")
ZYGOTE_MODULE = "octavo.worker.worker_zygote"


def rank_processes(root_pid: int) -> list[psutil.Process]:
    """The rank processes under ``root_pid`` (the zygote itself is not one)."""
    ranks = []
    for process in psutil.Process(root_pid).children(recursive=True):
        try:
            command = " ".join(process.cmdline())
            parent = process.parent()
            forked = parent is not None and ZYGOTE_MODULE in " ".join(parent.cmdline())
        except psutil.NoSuchProcess:
            continue
        if forked or any(module in command for module in SPAWNED_RANK_MODULES):
            ranks.append(process)
    return ranks
