"""``octavo run-batch``: OpenAI Batch files through the server's app, resumable and durable.

The runs in this process use the tiny random Llama-3 (a thread core); the crash tests run
the real command as a process, SIGKILL it halfway and rerun it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Coroutine
from pathlib import Path
from threading import Event, Timer
from unittest import mock

import pytest

from octavo.cli import main as octavo_main
from octavo.entrypoints.openai.context import ServerConfig
from octavo.entrypoints.openai.run_batch import output_file
from octavo.entrypoints.openai.run_batch.lines import (
    STREAM_MESSAGE,
    BadLine,
    BatchRequest,
    parse_line,
)
from octavo.entrypoints.openai.run_batch.runner import (
    BatchSettings,
    BatchSummary,
    RunFailed,
    run_batch,
)

from server_harness import build_local_app, torch_threads

ENGINE_KWARGS = {"max_model_len": 256, "kv_cache_memory": 8 << 20}
ENGINE_FLAGS = ["--max-model-len", "256", "--kv-cache-memory", str(8 << 20), "--num-threads", "1"]
LINE_COUNT = 200
MALFORMED = {11: "not json at all {", 91: None, 151: "unknown url"}  # line number -> kind
STREAM_LINE = 52
KILL_AFTER_LINES = 40
PROCESS_TIMEOUT = 240.0


# ----- the input file ---------------------------------------------------------------------
def line_kind(number: int) -> str:
    """What line ``number`` (1-based) of the mixed batch is."""
    if number in MALFORMED:
        return "malformed"
    if number == STREAM_LINE:
        return "stream"
    if number % 16 == 0:
        return "embeddings"
    if number % 25 == 5:
        return "responses"
    return "chat" if number % 2 else "completions"


def request_line(number: int, max_tokens: int) -> str:
    """Line ``number`` of the mixed batch: chat, completions, embeddings, responses, the
    three malformed lines and a completion with stream: true."""
    custom_id, kind = f"req-{number}", line_kind(number)
    sampling = {"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    if kind == "malformed":
        return malformed_line(number, custom_id)
    if kind == "embeddings":
        return as_line(custom_id, "/v1/embeddings", {"input": f"text {number}"})
    if kind == "responses":
        body = {"input": f"say {number}", "max_output_tokens": max_tokens, "temperature": 0}
        return as_line(custom_id, "/v1/responses", body)
    if kind == "chat":
        body = {"messages": [{"role": "user", "content": f"say {number}"}], **sampling}
        return as_line(custom_id, "/v1/chat/completions", body)
    body = {"prompt": f"number {number}", **sampling, "stream": kind == "stream"}
    return as_line(custom_id, "/v1/completions", body)


def malformed_line(number: int, custom_id: str) -> str:
    kind = MALFORMED[number]
    if kind is None:  # no custom_id: named after its line number
        return json.dumps({"method": "POST", "url": "/v1/completions", "body": {}})
    if kind == "unknown url":
        return as_line(custom_id, "/v1/nothing-here", {"prompt": "x"})
    return kind


def as_line(custom_id: str, url: str, body: dict) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def write_batch(path: Path, max_tokens: int = 2, count: int = LINE_COUNT) -> Path:
    path.write_text("".join(request_line(n, max_tokens) + "\n" for n in range(1, count + 1)))
    return path


def expected_ids(count: int = LINE_COUNT) -> Counter[str]:
    return Counter(custom_id_of(number) for number in range(1, count + 1))


def custom_id_of(number: int) -> str:
    """Line ``number``'s custom_id: the lines without one (not JSON, or no custom_id) are
    named after their line numbers."""
    has_none = number in MALFORMED and MALFORMED[number] != "unknown url"
    return f"line-{number}" if has_none else f"req-{number}"


def read_results(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


SUCCESS_OBJECTS = {
    "chat": "chat.completion",
    "completions": "text_completion",
    "embeddings": "list",
    "responses": "response",
}


def check_complete(results: list[dict]) -> None:
    """One result per input line, and each line's kind answered as it should be."""
    assert Counter(r["custom_id"] for r in results) == expected_ids()
    by_id = {r["custom_id"]: r for r in results}
    for number in range(1, LINE_COUNT + 1):
        result, kind = by_id[custom_id_of(number)], line_kind(number)
        assert result["id"].startswith("vllm-") and result["response"]["request_id"]
        if kind in ("malformed", "stream"):
            assert result["response"] == {**result["response"], "status_code": 400, "body": None}
            assert isinstance(result["error"], str) and f"line {number}" in result["error"]
            continue
        assert result["error"] is None and result["response"]["status_code"] == 200, result
        assert result["response"]["body"]["object"] == SUCCESS_OBJECTS[kind]
        if kind == "embeddings":  # the tiny model's hidden size, normalised (its pooler's)
            vector = result["response"]["body"]["data"][0]["embedding"]
            assert len(vector) == 64 and sum(x * x for x in vector) == pytest.approx(1.0)
    assert STREAM_MESSAGE in by_id[f"req-{STREAM_LINE}"]["error"]


# ----- running it in this process ---------------------------------------------------------
def run_here(
    tiny_folder,
    input_path: Path,
    output: Path,
    tmp_dir: Path | None = None,
    interrupt_at: int | None = None,
    on_engine=None,
    max_queue_len: int | None = None,
) -> BatchSummary | None:
    """The batch through a fresh app of the tiny model, in this process; with
    ``interrupt_at``, cancelled (as Ctrl-C would) once that many lines are written."""
    folder = str(tiny_folder("llama3"))
    config = ServerConfig(["tiny"], model_root=folder, max_queue_len=max_queue_len)
    app = build_local_app(folder, config, on_engine, **ENGINE_KWARGS)
    settings = BatchSettings(input_path, output, tmp_dir, 16, progress=False)
    with torch_threads(1):
        if interrupt_at is None:
            return asyncio.run(run_batch(app, settings))
        running = run_batch(app, settings)
        asyncio.run(cancel_at(running, interrupt_at))
    return None


async def cancel_at(run: Coroutine, lines: int) -> None:
    """Cancel ``run`` right after the write that brings its output to ``lines`` lines.
    (Polling the file missed it on a loaded machine: one group commit wrote 60 of 60.)"""
    task = asyncio.ensure_future(run)
    append = output_file.DurableAppender.append

    async def append_then_cancel(appender: output_file.DurableAppender, line: bytes) -> None:
        await append(appender, line)
        if appender.lines_written >= lines:
            task.cancel()

    patched = mock.patch.object(output_file.DurableAppender, "append", append_then_cancel)
    with patched, contextlib.suppress(asyncio.CancelledError):
        await task


def test_two_hundred_mixed_lines_give_two_hundred_results(tiny_folder, tmp_path):
    batch = write_batch(tmp_path / "in.jsonl")
    summary = run_here(tiny_folder, batch, tmp_path / "out.jsonl")
    check_complete(read_results(tmp_path / "out.jsonl"))
    assert (summary.lines, summary.written, summary.already_done) == (LINE_COUNT, LINE_COUNT, 0)


def test_rerun_skips_results_already_written_and_redoes_a_torn_line(tiny_folder, tmp_path):
    batch = write_batch(tmp_path / "in.jsonl", count=6)
    with batch.open("a") as file:  # a repeated custom_id: each occurrence gets a line
        file.write(as_line("req-2", "/v1/completions", {"prompt": "again", "max_tokens": 2}) + "\n")
    earlier = [
        {"id": "vllm-earlier-1", "custom_id": "req-2", "response": {}, "error": None},
        {"id": "vllm-earlier-2", "custom_id": "req-4", "response": {}, "error": None},
    ]
    kept = "".join(json.dumps(record) + "\n" for record in earlier)
    output = tmp_path / "out.jsonl"
    output.write_text(kept + '{"id": "vllm-torn", "custom_id": "req-5", "resp')
    summary = run_here(tiny_folder, batch, output)
    text = output.read_text()
    assert text.startswith(kept) and "vllm-torn" not in text
    ids = Counter(r["custom_id"] for r in read_results(output))
    assert ids == Counter(["req-1", "req-2", "req-2", "req-3", "req-4", "req-5", "req-6"])
    assert (summary.already_done, summary.written) == (2, 5)


def test_a_full_engine_queue_is_waited_out_not_written_as_errors(tiny_folder, tmp_path):
    """16 lines in flight against a queue of 1 (--max-queue-len): the 429s are retried."""
    batch = tmp_path / "in.jsonl"
    body = {"prompt": "count", "max_tokens": 2, "ignore_eos": True}
    batch.write_text("".join(as_line(f"q{n}", "/v1/completions", body) + "\n" for n in range(12)))
    summary = run_here(tiny_folder, batch, tmp_path / "out.jsonl", max_queue_len=1)
    results = read_results(tmp_path / "out.jsonl")
    assert sorted(r["response"]["status_code"] for r in results) == [200] * 12
    assert summary.errors == 0


def test_an_engine_that_fails_to_load_fails_the_run(tmp_path):
    from octavo.engine.core_thread import ThreadCore
    from octavo.entrypoints.openai.app import build_app

    def broken_engine():
        raise RuntimeError("no such weights")

    config = ServerConfig(served_model_names=["x"], model_root="x")
    app = build_app(config, ThreadCore(broken_engine))
    settings = BatchSettings(write_batch(tmp_path / "in.jsonl", count=3), tmp_path / "o", None, 4)
    with pytest.raises(RunFailed, match="did not load"):
        asyncio.run(run_batch(app, settings))
    assert (tmp_path / "o").read_text() == ""


def test_an_engine_that_dies_fails_the_run_and_leaves_its_lines_to_a_rerun(tiny_folder, tmp_path):
    def die_at_step_20(engine) -> None:
        step, steps = engine.step, itertools.count()

        def dying_step():
            if next(steps) == 20:
                raise RuntimeError("injected engine crash")
            return step()

        engine.step = dying_step

    batch, output = write_batch(tmp_path / "in.jsonl"), tmp_path / "out.jsonl"
    with pytest.raises(RunFailed, match="the engine stopped"):
        run_here(tiny_folder, batch, output, on_engine=die_at_step_20)
    results = read_results(output)
    assert len(results) < LINE_COUNT  # the lines in flight got no line: a rerun does them
    assert all(r["response"]["status_code"] in (200, 400) for r in results)


def test_a_full_disk_fails_the_run(tiny_folder, tmp_path, monkeypatch):
    def no_space(self, chunk: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(output_file.DurableAppender, "_write", no_space)
    batch = write_batch(tmp_path / "in.jsonl", count=4)
    with pytest.raises(RunFailed, match=r"writing the results failed: .*No space left"):
        run_here(tiny_folder, batch, tmp_path / "out.jsonl")


# ----- input lines and the output file ----------------------------------------------------
def deeply_nested_line() -> bytes:
    """A line of about 200 KB nested 100,000 deep: Python's JSON parser cannot read it."""
    body = "[" * 100_000 + "]" * 100_000
    return f'{{"custom_id": "deep", "method": "POST", "body": {body}}}'.encode()


def raw_line(**changes) -> bytes:
    record = {"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {}}
    return json.dumps({**record, **changes}).encode()


@pytest.mark.parametrize(
    ("raw", "custom_id", "message"),
    [
        (b"{not json", "line-7", "line 7 is not JSON"),
        (b"\xff\xfe{}", "line-7", "line 7 is not UTF-8"),
        (b"[1, 2]", "line-7", "line 7 is not an object"),
        (raw_line(custom_id=5), "line-7", "has no custom_id"),
        (raw_line(custom_id=""), "line-7", "has no custom_id"),
        (raw_line(method="GET"), "a", "method must be POST"),
        (raw_line(url="/v1/models"), "a", "url '/v1/models' is not supported"),
        (raw_line(body=[]), "a", "body must be a JSON object"),
        (raw_line(body={"stream": True}), "a", STREAM_MESSAGE),
        (deeply_nested_line(), "line-7", "line 7 is nested too deeply"),
    ],
)
def test_malformed_lines_are_named_and_explained(raw, custom_id, message):
    bad = parse_line(raw, 7)
    assert isinstance(bad, BadLine) and bad.custom_id == custom_id and message in bad.message


def test_a_well_formed_line_is_a_request():
    raw = b'{"custom_id": "a", "method": "post", "url": "/v1/embeddings", "body": {"input": "x"}}'
    assert parse_line(raw, 1) == BatchRequest(1, "a", "/v1/embeddings", {"input": "x"})


def test_an_unreadable_line_inside_the_output_is_refused(tmp_path):
    output = tmp_path / "out.jsonl"
    good = json.dumps({"id": "vllm-1", "custom_id": "a", "response": {}, "error": None})
    output.write_text(f"{good}\ngarbage\n{good}\n")
    with pytest.raises(ValueError, match=r"line 2 of .* is not a batch result line"):
        output_file.read_existing(output)


def test_a_deeply_nested_line_gets_an_error_line_and_the_batch_finishes(tiny_folder, tmp_path):
    """It raised RecursionError out of the run (exit 1, no output, the same on every rerun)."""
    batch, output = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    good = as_line("ok", "/v1/completions", {"prompt": "x", "max_tokens": 1})
    batch.write_bytes(deeply_nested_line() + b"\n" + good.encode() + b"\n")
    summary = run_here(tiny_folder, batch, output)
    by_id = {r["custom_id"]: r for r in read_results(output)}
    assert by_id.keys() == {"line-1", "ok"} and summary.errors == 1
    assert by_id["line-1"]["response"]["status_code"] == 400
    assert "line 1 is nested too deeply" in by_id["line-1"]["error"]
    assert by_id["ok"]["response"]["status_code"] == 200


@pytest.mark.parametrize(
    "content",
    [b"my notes\n", b"my notes, no newline", b"{}\n", deeply_nested_line() + b"\n"],
    ids=["text", "text-without-newline", "json-not-a-result", "deeply-nested"],
)
def test_a_file_that_is_not_a_batch_output_is_refused_untouched(
    tiny_folder, tmp_path, capsys, content
):
    """It was taken for a torn last line and truncated."""
    (tmp_path / "in.jsonl").write_text(as_line("a", "/v1/completions", {"prompt": "x"}) + "\n")
    output = tmp_path / "notes.txt"
    output.write_bytes(content)
    files = ["-i", str(tmp_path / "in.jsonl"), "-o", str(output)]
    model = str(tiny_folder("llama3"))
    capsys.readouterr()  # the first test to need the model shows its writing's progress
    assert octavo_main(["run-batch", *files, model]) == 2
    err = capsys.readouterr().err
    assert "line 1 of" in err and "is not a batch result line" in err and "Traceback" not in err
    assert output.read_bytes() == content


def test_a_symbolic_link_output_is_refused_not_followed(tiny_folder, tmp_path, capsys):
    (tmp_path / "in.jsonl").write_text(as_line("a", "/v1/completions", {"prompt": "x"}) + "\n")
    target, link = tmp_path / "elsewhere.jsonl", tmp_path / "out.jsonl"
    target.write_text("")
    link.symlink_to(target)
    files = ["-i", str(tmp_path / "in.jsonl"), "-o", str(link)]
    assert octavo_main(["run-batch", *files, str(tiny_folder("llama3"))]) == 2
    assert "is a symbolic link" in capsys.readouterr().err
    assert target.read_text() == "" and link.is_symlink()
    with pytest.raises(ValueError, match="cannot write"):  # a link made after the checks
        output_file.DurableAppender(link)


def unwritable_folder(tmp_path: Path) -> Path:
    """A folder this process cannot create files in: a read-only one, or (as root, who may
    write anywhere else) sysfs."""
    if os.geteuid() != 0:
        folder = tmp_path / "read-only"
        folder.mkdir(mode=0o500)
        return folder
    if not Path("/sys/kernel").is_dir():
        pytest.skip(reason="running as root without sysfs: no folder here refuses root's writes")
    return Path("/sys/kernel")


def test_an_unwritable_output_is_one_line_and_exit_2(tiny_folder, tmp_path, capsys):
    """It was a PermissionError traceback."""
    (tmp_path / "in.jsonl").write_text("")
    output = unwritable_folder(tmp_path) / "out.jsonl"
    files = ["-i", str(tmp_path / "in.jsonl"), "-o", str(output)]
    model = str(tiny_folder("llama3"))
    capsys.readouterr()  # the first test to need the model shows its writing's progress
    assert octavo_main(["run-batch", *files, model]) == 2
    err = capsys.readouterr().err
    assert f"cannot write in {output.parent}" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err


def test_blank_lines_in_the_output_are_kept_and_a_torn_result_dropped(tmp_path):
    output = tmp_path / "out.jsonl"
    good = json.dumps({"id": "vllm-1", "custom_id": "a", "response": {}, "error": None})
    output.write_text(f"{good}\n\n{good}\n{good[:10]}")
    existing = output_file.read_existing(output)
    assert existing.done == Counter(a=2)
    assert existing.keep_bytes == len(f"{good}\n\n{good}\n")


def test_two_runs_cannot_write_one_output(tmp_path):
    first = output_file.DurableAppender(tmp_path / "out.jsonl")
    try:
        with pytest.raises(ValueError, match="another octavo run-batch is writing"):
            output_file.DurableAppender(tmp_path / "out.jsonl")
    finally:
        first.close()


def test_a_cancelled_write_finishes_before_the_file_closes(tmp_path, monkeypatch):
    """Ctrl-C cancels the appends in flight; their threads still write, so ``close`` waits for
    them (else the fd is closed, or reused by another file, under a thread writing to it)."""
    path, started, release, errors = tmp_path / "out.jsonl", Event(), Event(), []
    appender, real_fsync = output_file.DurableAppender(path), os.fsync

    def slow_fsync(fd: int) -> None:
        started.set()
        release.wait(5)
        try:
            real_fsync(fd)
        except OSError as error:
            errors.append(error)

    monkeypatch.setattr(os, "fsync", slow_fsync)

    async def cancel_mid_write() -> None:
        task = asyncio.create_task(appender.append(b"line\n"))
        await asyncio.to_thread(started.wait, 5)
        task.cancel()
        Timer(0.2, release.set).start()
        appender.close()

    asyncio.run(cancel_mid_write())
    assert errors == [] and path.read_bytes() == b"line\n"


@pytest.mark.parametrize(
    ("flags", "limit", "expected"),
    [
        ([], 512, 2 * 256),  # twice --max-num-seqs (256 by default)
        (["--max-num-seqs", "8"], 10, 10),  # within --limit-concurrency
        (["--max-num-seqs", "8", "--max-queue-len", "3"], 512, 11),  # what runs and queues
        (["--max-concurrency", "5", "--max-queue-len", "1"], 512, 5),
    ],
)
def test_the_default_concurrency_fills_the_engine_within_the_apps_caps(flags, limit, expected):
    from octavo.cli import build_parser
    from octavo.entrypoints.openai.cli import parsed_engine_args
    from octavo.entrypoints.openai.run_batch.cli import max_concurrency

    args = build_parser().parse_args(["run-batch", "-i", "in", "-o", "out", *flags])
    engine_args = parsed_engine_args(args)
    assert max_concurrency(args, limit, engine_args.max_num_seqs) == expected


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["-i", "missing.jsonl", "-o", "out.jsonl"], "-i missing.jsonl: no such file"),
        (["-i", "in.jsonl", "-o", "https://example.com/out"], "-o takes a local file"),
        (["-i", "in.jsonl", "-o", "no/such/folder/out.jsonl"], "not a file in an existing folder"),
        (["-i", "in.jsonl", "-o", "in.jsonl"], "-o must not be the input file"),
        (["-i", "in.jsonl", "-o", "o", "--output-tmp-dir", "nowhere"], "nowhere: no such folder"),
    ],
)
def test_bad_files_fail_before_the_model_is_read(tmp_path, monkeypatch, capsys, flags, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in.jsonl").write_text("")
    assert octavo_main(["run-batch", *flags, str(tmp_path / "no-model-here")]) == 2
    assert message in capsys.readouterr().err


def test_more_lines_in_flight_than_the_app_takes_is_refused(tiny_folder, tmp_path, capsys):
    (tmp_path / "in.jsonl").write_text("")
    files = ["-i", str(tmp_path / "in.jsonl"), "-o", str(tmp_path / "out.jsonl")]
    flags = ["--limit-concurrency", "8", "--max-concurrency", "9"]
    assert octavo_main(["run-batch", *files, *flags, str(tiny_folder("llama3"))]) == 2
    assert "--max-concurrency 9 is above --limit-concurrency 8" in capsys.readouterr().err


# ----- the real command, killed halfway -----------------------------------------------------
def batch_command(folder: Path, batch: Path, output: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "octavo.cli",
        "run-batch",
        "-i",
        str(batch),
        "-o",
        str(output),
        str(folder),
        *ENGINE_FLAGS,
        "--max-concurrency",
        "8",
        *extra,
    ]


def process_env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def kill_after_lines(command: list[str], written: Path, lines: int, log: Path) -> None:
    """Run ``command``; SIGKILL it (not its engine core: that one sees its pipe close) once
    ``written`` holds ``lines`` complete lines, and while the run is still going."""
    with log.open("w") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=process_env(), start_new_session=True
        )
    try:
        deadline = time.monotonic() + PROCESS_TIMEOUT
        while complete_lines(written) < lines:
            assert process.poll() is None, f"the run ended early:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, "no output in time"
            time.sleep(0.02)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
        kill_group(process.pid)


def kill_group(pid: int) -> None:
    """What is left of the run we started (its engine core), so the rerun has the CPU."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def complete_lines(path: Path | None) -> int:
    return path.read_bytes().count(b"\n") if path is not None and path.exists() else 0


def test_sigkill_halfway_then_rerun_loses_and_repeats_no_line(tiny_folder, tmp_path):
    folder = tiny_folder("llama3")
    batch = write_batch(tmp_path / "in.jsonl", max_tokens=4)
    output = tmp_path / "out.jsonl"
    command = batch_command(folder, batch, output, "--no-progress")
    kill_after_lines(command, output, KILL_AFTER_LINES, tmp_path / "first.log")
    written = output.read_bytes()
    done = written[: written.rfind(b"\n") + 1]  # a torn last line is redone
    done_count = done.count(b"\n")
    assert KILL_AFTER_LINES <= done_count < LINE_COUNT
    rerun = subprocess.run(
        command, capture_output=True, text=True, env=process_env(), timeout=PROCESS_TIMEOUT
    )
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert output.read_bytes().startswith(done)  # the lines written before stay as they were
    check_complete(read_results(output))
    redone = LINE_COUNT - done_count
    assert f"{redone} results written now" in rerun.stderr
    assert f"{done_count} already in" in rerun.stderr


def test_output_tmp_dir_leaves_no_partial_output_until_done(tiny_folder, tmp_path):
    """The working file has a random name (O_EXCL): a link planted at the name it once had
    (the output's name and a digest of its path) is neither followed nor resumed from."""
    batch = write_batch(tmp_path / "in.jsonl", count=60)
    output, tmp_dir, victim = tmp_path / "out.jsonl", tmp_path / "work", tmp_path / "victim"
    tmp_dir.mkdir()
    victim.write_text("not yours\n")
    planted = output_file.working_prefix(output).removesuffix(".") + output_file.WORKING_SUFFIX
    (tmp_dir / planted).symlink_to(victim)
    (tmp_dir / f"{output_file.working_prefix(output)}x{output_file.WORKING_SUFFIX}").symlink_to(
        victim
    )
    run_here(tiny_folder, batch, output, tmp_dir, interrupt_at=20)
    assert not output.exists() and victim.read_text() == "not yours\n"
    working = output_file.find_working(output, tmp_dir)
    assert working is not None and working.stat().st_mode & 0o077 == 0  # private
    done = working.read_bytes()
    assert 20 <= done.count(b"\n") < 60 and done.endswith(b"\n")
    summary = run_here(tiny_folder, batch, output, tmp_dir)
    assert not working.exists() and output.read_bytes().startswith(done)
    assert Counter(r["custom_id"] for r in read_results(output)) == expected_ids(60)
    assert (summary.already_done, summary.written) == (done.count(b"\n"), 60 - done.count(b"\n"))
    assert victim.read_text() == "not yours\n"
