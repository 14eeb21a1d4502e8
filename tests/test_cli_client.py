"""``octavo chat`` and ``octavo complete`` against a real server on loopback (the tiny
random Llama: its text is noise, so the tests check what reaches the terminal and the
exit status), and their one-line errors."""

from __future__ import annotations

import io
import subprocess
import sys
from collections.abc import Iterator

import pytest

from octavo.cli import main
from octavo.entrypoints import client_cli

from conftest import running_tiny_server

SERVED = "tiny-cli"


@pytest.fixture(scope="module")
def api_url(tiny_folder) -> Iterator[str]:
    with running_tiny_server(tiny_folder, SERVED) as url:
        yield f"{url}/v1"


def test_chat_quick_streams_one_reply_and_exits(api_url, capsys):
    argv = ["chat", "--url", api_url, "--system-prompt", "Be brief.", "--max-tokens", "4"]
    assert main([*argv, "-q", "Hello"]) == 0
    out = capsys.readouterr().out
    assert out.endswith("\n") and out.strip()


def test_interactive_chat_keeps_the_conversation(api_url, monkeypatch):
    sent = []
    original = client_cli.chat_reply

    def recording(client, model, messages, out, max_tokens):
        sent.append([dict(m) for m in messages])
        return original(client, model, messages, out, max_tokens)

    monkeypatch.setattr(client_cli, "chat_reply", recording)
    args = client_cli.build_args(["chat", "--url", api_url, "--max-tokens", "3"])
    out = io.StringIO()
    assert client_cli.run_chat(args, io.StringIO("first\nsecond\n\n"), out) == 0
    assert [m["content"] for m in sent[1] if m["role"] == "user"] == ["first", "second"]
    assert [m["role"] for m in sent[1]] == ["user", "assistant", "user"]
    assert sent[0][0]["content"] == "first" and out.getvalue().count("> ") == 3


def test_complete_reads_prompts_until_an_empty_line(api_url, monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO("Once upon\nThe end\n\n"))
    assert main(["complete", "--url", api_url, "--model-name", SERVED, "--max-tokens", "4"]) == 0
    out = capsys.readouterr().out
    assert out.count("> ") == 3 and len(out.splitlines()) >= 3


def test_an_unknown_model_is_the_servers_refusal_in_one_line(api_url, capsys):
    assert main(["complete", "--url", api_url, "--model-name", "nope", "-q", "Hi"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("octavo complete: error: the server answered 404") and "\n" not in err


def test_an_unreachable_server_is_one_line(capsys):
    assert main(["chat", "--url", "http://127.0.0.1:9/v1", "-q", "Hi"]) == 1
    err = capsys.readouterr().err.strip()
    assert "cannot reach http://127.0.0.1:9/v1" in err and "octavo serve" in err
    assert "\n" not in err


def test_the_octavo_command_and_its_clients_start_without_torch():
    """``octavo`` builds every subcommand's parser, and the clients run, without importing
    torch or transformers (2.4 s of CPU at each start before: ``octavo --help`` 2.37 s ->
    0.44 s wall on a 2-vCPU AMD EPYC); ``octavo serve``'s engine imports them itself."""
    probe = (
        "import sys\n"
        "from octavo.cli import build_parser\n"
        "from octavo.entrypoints import client_cli\n"
        "build_parser()\n"
        "print(sorted({'torch', 'transformers'} & set(sys.modules)))\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
