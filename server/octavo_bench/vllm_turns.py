"""vLLM's runner taking turns with Octavo (``offline --rounds``): started once, it loads
and warms up while Octavo waits, then runs one workload each time it is told to, while
Octavo's engine sits idle; Octavo runs the same workload just before. A pair of runs is
then seconds apart, not one engine's whole set of workloads (minutes), on a machine whose
speed drifts. The protocol is vllm_runner.py's turns mode: a line on the runner's stdin
starts its next workload, its replies come back as JSON lines on a pipe of their own
(its stdout and stderr go to the log)."""

from __future__ import annotations

import json
import os
import select
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType

from octavo_bench.report import RunResult
from octavo_bench.vllm_baseline import (
    RUNNER,
    VllmRunError,
    VllmSetup,
    last_line,
    to_run_result,
)

POLL_SECONDS = 1.0  # how often a wait for the runner's reply checks that it still runs


class VllmTurns:
    """The runner in turns mode over REQUEST's workloads, in their order."""

    def __init__(self, setup: VllmSetup, request: dict, log_path: Path) -> None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path = log_path
        self.scratch = tempfile.TemporaryDirectory(prefix="octavo-vllm-")
        self.result_path = Path(self.scratch.name, "result.json")
        self.result: dict = {}  # the runner's result file, read as it exits (version, ISA)
        read_end, write_end = os.pipe()
        request_path = Path(self.scratch.name, "request.json")
        request_path.write_text(json.dumps({**request, "turns": True, "reply_fd": write_end}))
        command = [str(setup.python), str(RUNNER), str(request_path), str(self.result_path)]
        with log_path.open("wb") as log:
            self.process = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=setup.env,
                pass_fds=(write_end,),
            )
        os.close(write_end)
        self.replies = os.fdopen(read_end, "rb", buffering=0)  # no line left behind select

    def __enter__(self) -> VllmTurns:
        try:
            self._reply()  # {"ready": true}: loaded and warmed up
        except BaseException as error:
            self.__exit__(type(error), error, error.__traceback__)
            raise
        return self

    def turn(self) -> RunResult:
        """The next workload, run now; its result."""
        assert self.process.stdin is not None
        self.process.stdin.write(b"go\n")
        self.process.stdin.flush()
        return to_run_result(self._reply())

    def _reply(self) -> dict:
        """The runner's next line; VllmRunError (with its log's last line) if it ended."""
        line = b""
        while True:
            if select.select([self.replies], [], [], POLL_SECONDS)[0]:
                line = self.replies.readline()  # b"" at the pipe's end
                break
            if self.process.poll() is not None:  # its own children may hold the pipe open
                break
        if not line:
            code = self.process.wait()
            raise VllmRunError(
                f"vLLM exited with code {code}: {last_line(self.log_path)} (log: {self.log_path})"
            )
        return json.loads(line)

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        """Tell the runner there is no next turn; it writes its result file and exits."""
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.replies.close()
        if self.result_path.is_file():
            self.result = json.loads(self.result_path.read_text())
        self.scratch.cleanup()
