"""``kill -USR1`` on an Octavo process prints every thread's stack into its log, and the
tests' overrun helper asks only the processes that handle the signal (it kills others)."""

from __future__ import annotations

import subprocess
import sys
import time

from octavo import stack_dumps
from octavo.stack_dumps import STACK_DUMP_SIGNAL
from stuck_processes import catches, dump_stacks

# The module alone, from its file: importing the ``octavo`` package would cost seconds.
WAITING = f"""
import importlib.util, threading, time
spec = importlib.util.spec_from_file_location("stack_dumps", {stack_dumps.__file__!r})
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
module.dump_stacks_on_signal()
def waits_for_its_peer():
    time.sleep(60)
threading.Thread(target=waits_for_its_peer, daemon=True).start()
print("ready", flush=True)
time.sleep(60)
"""


def test_the_signal_prints_every_threads_stack_and_the_process_goes_on():
    process = subprocess.Popen(
        [sys.executable, "-c", WAITING], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout.readline() == "ready\n"
        assert catches(process.pid, STACK_DUMP_SIGNAL)
        dump_stacks(process.pid)
        assert process.poll() is None
    finally:
        process.kill()
    errors = process.communicate()[1]
    assert "waits_for_its_peer" in errors and errors.count("hread 0x") == 2, errors


def test_a_process_without_the_handler_is_left_alone():
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.2)
        assert not catches(process.pid, STACK_DUMP_SIGNAL)
        dump_stacks(process.pid)
        assert process.poll() is None
    finally:
        process.kill()
        process.wait()
