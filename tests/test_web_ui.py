"""The built-in web page (entrypoints/openai/web_routes.py, web/) in a real browser.

Headless Chromium (Debian's ``chromium``, installed by ``make test-tools``) loads the page
from a real tiny server behind ``--api-key``: the page asks for the key, the test types it,
sends a chat message, waits for the streamed reply (equal to the same request made without
streaming) and for the live view's counters to move, and asserts that the page logged no
error. Screenshots go to the test's tmp folder; ``OCTAVO_UPDATE_WEB_UI_SCREENSHOT=1`` also
writes docs/web-ui.png (the README's picture). Without Chromium the browser tests skip,
except on CI (``CI=true``), where they fail.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from headless_chromium import Page, find_chromium, headless_chromium
from octavo.entrypoints.openai import web_routes
from octavo.entrypoints.openai.context import ServerConfig
from octavo.entrypoints.openai.options import OPTIONS

API_KEY = "web-ui-test-key"
SERVED_NAME = "tiny-web"
DOCS_SCREENSHOT = Path(__file__).parent.parent / "docs" / "web-ui.png"
REPLY_TOKENS = 24
REPLY_TEXT = """[...document.querySelector('.message.assistant').childNodes]
    .filter((node) => node.nodeType === Node.TEXT_NODE).map((node) => node.nodeValue).join('')"""


@contextmanager
def keyed_tiny_server(tiny_folder) -> Iterator[str]:
    """A real tiny Llama server on loopback that needs ``API_KEY``; yields its URL."""
    from server_harness import ThreadedServer, build_local_app, torch_threads

    config = ServerConfig(served_model_names=[SERVED_NAME], model_root=SERVED_NAME, api_key=API_KEY)
    model = str(tiny_folder("llama3"))
    app = build_local_app(model, config, max_model_len=256, kv_cache_memory=8 << 20)
    with torch_threads(1), ThreadedServer(app) as server:
        yield server.wait_ready().url


@pytest.fixture(scope="module")
def server_url(tiny_folder) -> Iterator[str]:
    with keyed_tiny_server(tiny_folder) as url:
        yield url


@pytest.fixture(scope="module")
def chromium() -> str:
    found = find_chromium()
    if found:
        return found
    if os.environ.get("CI") == "true":
        pytest.fail(
            "chromium is not installed: run `make test-tools` (scripts/install-test-tools.sh)"
        )
    pytest.skip(reason="chromium is not installed (`make test-tools` installs it)")


@pytest.fixture
def page(chromium, tmp_path) -> Iterator[Page]:
    with headless_chromium(chromium, tmp_path / "profile", (1360, 900)) as opened:
        yield opened


def chat_reply_without_streaming(url: str, system: str, message: str) -> str:
    """What the page's request gives when asked without streaming (greedy: the same text).
    Its own ``cache_salt`` keeps it off the page request's cached prefix, so both compute
    the prompt the same way (a random tiny model's close logits could differ otherwise)."""
    body = {
        "model": SERVED_NAME,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": message}],
        "temperature": 0,
        "max_tokens": REPLY_TOKENS,
        "cache_salt": "reference",
    }
    headers = {"Authorization": f"Bearer {API_KEY}"}
    response = httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=30)
    response.raise_for_status()
    return response.json()["choices"][0]["message"]["content"]


def enter_key(page: Page, key: str) -> None:
    page.wait_for("!document.getElementById('key-form').hidden", 10, "no API key prompt")
    page.type_into("#key-input", key)
    page.evaluate("document.getElementById('key-save').click()")


def set_field(page: Page, selector: str, value: str) -> None:
    page.evaluate(f"document.querySelector({json.dumps(selector)}).value = {json.dumps(value)}")


def counter(page: Page, card: str) -> float:
    """The running total a live-view card shows (0 before the first one)."""
    selector = json.dumps(f'.card[data-metric="{card}"] .total')
    return float(page.evaluate(f"document.querySelector({selector}).dataset.value") or 0)


def save_screenshot(page: Page, path: Path) -> None:
    page.screenshot(path)
    assert path.stat().st_size > 10_000, "the screenshot looks blank"
    if os.environ.get("OCTAVO_UPDATE_WEB_UI_SCREENSHOT") == "1":
        DOCS_SCREENSHOT.parent.mkdir(exist_ok=True)
        shutil.copyfile(path, DOCS_SCREENSHOT)


def test_page_streams_a_chat_reply_and_shows_the_counters_move(page, server_url, tmp_path):
    page.navigate(f"{server_url}/?poll=400")
    enter_key(page, API_KEY)
    page.wait_for(f"document.getElementById('model').value === '{SERVED_NAME}'", 10, "no models")
    page.wait_for("document.querySelector('.card .value').dataset.value !== undefined", 5, "")
    generated_before = counter(page, "generation")

    system, message = "You are terse.", "Say hello to the web page."
    page.type_into("#system", system)
    set_field(page, "#temperature", "0")
    set_field(page, "#max-tokens", str(REPLY_TOKENS))
    page.type_into("#prompt", message)
    page.evaluate("document.getElementById('send').click()")
    page.wait_for(
        "document.querySelector('.message.assistant')?.dataset.state === 'done'",
        20,
        "the streamed reply did not finish",
    )
    reply = page.evaluate(REPLY_TEXT)
    assert reply and reply == chat_reply_without_streaming(server_url, system, message)
    assert "generated tokens" in page.evaluate("document.querySelector('.meta').textContent")

    page.wait_for(
        f"Number(document.querySelector('.card[data-metric=\"generation\"] .total')"
        f".dataset.value) >= {generated_before + REPLY_TOKENS}",
        10,
        "the generated-token counter did not move",
    )
    assert counter(page, "running") >= 1  # requests finished
    page.wait_for(
        "document.querySelector('.card[data-metric=\"ttft\"] polyline')"
        ".getAttribute('points') !== ''",
        5,
        "no TTFT line",
    )
    assert page.evaluate("document.getElementById('error').hidden"), page.evaluate(
        "document.getElementById('error').textContent"
    )
    assert page.evaluate("sessionStorage.getItem('octavo-api-key')") == API_KEY
    assert page.evaluate("document.getElementById('key-form').offsetParent === null")  # gone
    save_screenshot(page, tmp_path / "web-ui.png")
    # Only the browser's line for the key-less first call (the 401 that made the page ask).
    assert [p for p in page.problems if "status of 401" not in p] == []


def test_page_shows_a_wrong_key_and_a_bad_request(page, server_url, tmp_path):
    page.navigate(f"{server_url}/?poll=400")
    page.evaluate("sessionStorage.setItem('octavo-api-key', 'wrong')")
    page.navigate(f"{server_url}/?poll=400")  # the same tab: the wrong key is sent
    page.wait_for("document.getElementById('error').textContent.includes('401')", 10, "no 401")
    assert "API key" in page.evaluate("document.getElementById('error').textContent")
    enter_key(page, API_KEY)
    page.wait_for("document.getElementById('error').hidden", 10, "the 401 stayed shown")

    set_field(page, "#max-tokens", "100000")  # over max_model_len: the server answers 400
    page.type_into("#prompt", "Too long an answer, please.")
    page.evaluate("document.getElementById('send').click()")
    shown = page.wait_for(
        "document.querySelector('.message.error')?.textContent", 20, "the 400 was not shown"
    )
    assert shown.startswith("Chat: 400")
    assert page.evaluate("document.querySelector('.message.assistant').dataset.state") == "failed"
    page.screenshot(tmp_path / "web-ui-errors.png")
    # The browser logs the failed 401/400 fetches as errors; nothing else may show up.
    assert [p for p in page.problems if "status of 40" not in p] == []


def test_the_page_loads_without_the_key_and_the_api_still_needs_it(server_url):
    page = httpx.get(f"{server_url}/", timeout=10)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in page.headers["content-security-policy"]
    assert '<script src="/ui/app.js"' in page.text
    script = httpx.get(f"{server_url}/ui/app.js", timeout=10)
    assert script.headers["content-type"].startswith("text/javascript")
    assert httpx.get(f"{server_url}/ui/style.css", timeout=10).status_code == 200
    for path in ("/v1/models", "/ui/missing.js", "/docs"):
        assert httpx.get(f"{server_url}{path}", timeout=10).status_code == 401, path


@pytest.mark.parametrize("disabled", [False, True])
def test_disable_web_ui_leaves_the_page_out(disabled):
    app = FastAPI()
    config = ServerConfig(served_model_names=["m"], model_root="m", disable_web_ui=disabled)
    web_routes.install(app, config)
    response = TestClient(app).get("/")
    assert response.status_code == (404 if disabled else 200)


def test_disable_web_ui_is_a_serve_flag():
    from octavo.cli import build_parser

    assert "--disable-web-ui" in {option.flag for option in OPTIONS}
    args = build_parser().parse_args(["serve", "some/model", "--disable-web-ui"])
    assert args.disable_web_ui is True
    assert build_parser().parse_args(["serve", "some/model"]).disable_web_ui is False
