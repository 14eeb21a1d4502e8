"""The activator over real HTTP: a request for a service at zero wakes it (replicas 0 -> 1),
waits for a pod that answers /health, and is forwarded with its body and headers; the
answer streams back (server-sent events). Requests it cannot serve get OpenAI-style JSON
errors. The API side is a fake (the e2e test runs it against a real apiserver)."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web

from octavo_operator.activator import Activator, ActivatorSettings, serve_in_thread
from octavo_operator.activator_target import Target

HOST = "chat.team-a.svc.cluster.local:8000"


class FakeWaker:
    """A service at zero whose pod turns ready two polls after it is woken."""

    def __init__(self, upstream: str, min_replicas: int = 0, exists: bool = True) -> None:
        self.upstream, self.min_replicas, self.exists = upstream, min_replicas, exists
        self.replicas, self.wakes, self.polls_since_wake = 0, 0, 0

    def caller_namespace(self, ip: str) -> str | None:
        return "team-a"

    def read(self, target: Target) -> dict[str, Any] | None:
        if not self.exists:
            return None
        spec = {
            "replicas": self.replicas,
            "autoscaling": {"minReplicas": self.min_replicas, "maxReplicas": 2},
        }
        meta = {"name": target.name, "namespace": target.namespace, "resourceVersion": "7"}
        return {"metadata": meta, "spec": spec}

    def wake(self, body: dict[str, Any]) -> bool:
        if body["spec"]["replicas"]:
            return False
        self.replicas, self.wakes = 1, self.wakes + 1
        return True

    def ready_pod_urls(self, target: Target) -> list[str]:
        if not self.replicas:
            return []
        self.polls_since_wake += 1
        return [self.upstream] if self.polls_since_wake > 2 else []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def completions(request: web.Request) -> web.StreamResponse:
    """An OpenAI-like server: streams the prompt back word by word as server-sent events."""
    body = await request.json()
    reply = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await reply.prepare(request)
    for word in body["prompt"].split():
        await reply.write(f"data: {json.dumps({'text': word})}\n\n".encode())
    auth = request.headers.get("Authorization", "")
    await reply.write(f"data: {json.dumps({'auth': auth})}\n\ndata: [DONE]\n\n".encode())
    return reply


async def health(request: web.Request) -> web.Response:
    return web.Response(text="ok")


@pytest.fixture(scope="module")
def upstream() -> str:
    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_post("/v1/completions", completions)
    port = free_port()

    def serve() -> None:
        web.run_app(app, host="127.0.0.1", port=port, print=None, handle_signals=False)

    threading.Thread(target=serve, daemon=True).start()
    return f"http://127.0.0.1:{port}"


def start_activator(waker: FakeWaker, timeout: float = 10.0) -> str:
    port = free_port()
    activator = Activator(waker, ActivatorSettings(timeout_seconds=timeout, poll_seconds=0.05))
    serve_in_thread(activator, port, host="127.0.0.1")
    return f"http://127.0.0.1:{port}"


def post(url: str, body: dict[str, Any], host: str = HOST) -> tuple[int, str, str]:
    headers = {"Host": host, "Content-Type": "application/json", "Authorization": "Bearer k"}
    request = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(), headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, reply.headers.get("Content-Type", ""), reply.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.headers.get("Content-Type", ""), error.read().decode()


@pytest.fixture
def served(upstream: str) -> Iterator[tuple[FakeWaker, str]]:
    waker = FakeWaker(upstream)
    yield waker, start_activator(waker)


def test_a_request_at_zero_wakes_the_service_and_is_forwarded(served) -> None:
    waker, url = served
    status, kind, text = post(url, {"prompt": "one two three"})
    assert status == 200 and kind.startswith("text/event-stream")
    events = [json.loads(line[6:]) for line in text.split("\n\n") if line.startswith("data: {")]
    assert [e["text"] for e in events[:3]] == ["one", "two", "three"]
    assert events[3] == {"auth": "Bearer k"}, "headers reach the pod"
    assert text.endswith("data: [DONE]\n\n")
    assert waker.wakes == 1 and waker.replicas == 1
    assert post(url, {"prompt": "again"})[0] == 200 and waker.wakes == 1, "up: no second wake"


def test_a_bare_host_name_uses_the_callers_namespace(served) -> None:
    _, url = served
    assert post(url, {"prompt": "hi"}, host="chat:8000")[0] == 200


def error_of(text: str) -> dict[str, Any]:
    error = json.loads(text)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def test_requests_it_cannot_serve_get_json_errors(upstream: str) -> None:
    gone = start_activator(FakeWaker(upstream, exists=False))
    status, _, text = post(gone, {"prompt": "hi"})
    assert status == 404 and "no InferenceService chat in team-a" in error_of(text)["message"]
    always_up = FakeWaker(upstream, min_replicas=1)
    status, _, text = post(start_activator(always_up), {"prompt": "hi"})
    assert status == 404 and "does not scale to zero" in error_of(text)["message"]
    assert always_up.wakes == 0, "a service stopped on purpose is not started"
    status, _, text = post(start_activator(FakeWaker(upstream)), {"prompt": "hi"}, host="10.0.0.1")
    assert status == 404 and "names no service" in error_of(text)["message"]


def test_a_taken_port_fails_at_start_up(upstream: str) -> None:
    url = start_activator(FakeWaker(upstream))
    taken = int(url.rsplit(":", 1)[1])
    with pytest.raises(OSError, match="cannot listen"):
        serve_in_thread(Activator(FakeWaker(upstream), ActivatorSettings()), taken, "127.0.0.1")


def test_no_ready_pod_within_the_timeout_is_a_503(upstream: str) -> None:
    never = FakeWaker(upstream)
    never.ready_pod_urls = lambda target: []  # type: ignore[method-assign]
    status, _, text = post(start_activator(never, timeout=0.5), {"prompt": "hi"})
    error = error_of(text)
    assert status == 503 and error["type"] == "service_unavailable"
    assert "no replica of team-a/chat became ready within 0.5 s" in error["message"]
    assert never.wakes == 1


class CountingWaker(FakeWaker):
    """A service at zero whose pod turns ready when the test says; counts every API call."""

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self.pod_ready = threading.Event()
        self.calls: Counter[str] = Counter()
        self.lock = threading.Lock()

    def count(self, name: str) -> None:
        with self.lock:
            self.calls[name] += 1

    def read(self, target: Target) -> dict[str, Any] | None:
        self.count("get")
        return super().read(target)

    def wake(self, body: dict[str, Any]) -> bool:
        self.count("scale")
        return super().wake(body)

    def ready_pod_urls(self, target: Target) -> list[str]:
        self.count("list")
        return [self.upstream] if self.pod_ready.is_set() else []


def test_held_requests_share_one_poller_and_are_all_released(upstream: str) -> None:
    """20 requests held for one service make the API calls of one (a get and a list a
    tick), not 20 times as many; all are answered once a pod turns ready."""
    held, poll, hold_seconds = 20, 0.05, 1.0
    waker = CountingWaker(upstream)
    port = free_port()
    settings = ActivatorSettings(timeout_seconds=30, poll_seconds=poll)
    serve_in_thread(Activator(waker, settings), port, host="127.0.0.1")
    answers: list[int] = []

    def call() -> None:
        answers.append(post(f"http://127.0.0.1:{port}", {"prompt": "hi"})[0])

    callers = [threading.Thread(target=call) for _ in range(held)]
    started = time.monotonic()
    for caller in callers:
        caller.start()
    time.sleep(hold_seconds)
    waker.pod_ready.set()
    for caller in callers:
        caller.join(timeout=30)
    ticks = (time.monotonic() - started) / poll + 1  # each tick sleeps the poll period
    assert answers == [200] * held, "every held request released when the pod is ready"
    assert waker.calls["list"] <= ticks and waker.calls["get"] <= ticks, (waker.calls, ticks)
    assert waker.calls["list"] < 2 * hold_seconds / poll, "one list a tick, not one a request"
    assert waker.wakes == 1
