"""The activator: where a scale-to-zero InferenceService's traffic goes while it has no
ready pod (its EndpointSlice points here, see idle_scaler.py).

For each request: find the service it was sent to (activator_target.py), set it from 0 to
1 replica if it is at 0, wait until one of its pods is ready and answers /health, then
forward the request there and stream the answer back (server-sent events included). The
requests held for one service share one poller of the API (activator_wakeup.py). A
request that cannot be served gets an OpenAI-style JSON error: 404 for no such service,
503 when no pod answered within the activation timeout. Every operator replica runs one
(on --activator-port), leader or not; it needs only the API and the pods' network.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass

import aiohttp
from aiohttp import web

from octavo_operator import metrics
from octavo_operator.activator_target import Target, UnknownTarget, target_from_host
from octavo_operator.activator_waker import ServiceWaker
from octavo_operator.activator_wakeup import WakeUps

logger = logging.getLogger(__name__)
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
HEALTH_TIMEOUT = aiohttp.ClientTimeout(total=2)
FORWARD_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=10)


@dataclass(frozen=True)
class ActivatorSettings:
    timeout_seconds: float = 600.0  # a GPU pod may pull an image and load a model meanwhile
    poll_seconds: float = 0.5


class NoPod(Exception):
    """No ready pod answered /health within the activation timeout."""


def error_response(status: int, message: str, kind: str) -> web.Response:
    body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return web.json_response(body, status=status)


class Activator:
    def __init__(self, waker: ServiceWaker, settings: ActivatorSettings) -> None:
        self.waker = waker
        self.settings = settings
        self._session: aiohttp.ClientSession | None = None
        self.wake_ups = WakeUps(waker, self._healthy, settings.poll_seconds)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        started = time.monotonic()
        try:
            target = await self._target(request)
            url = await self._ready_pod(target, started + self.settings.timeout_seconds)
        except UnknownTarget as error:
            metrics.ACTIVATOR_REQUESTS.labels("no_service").inc()
            return error_response(404, str(error), "not_found_error")
        except NoPod as error:
            metrics.ACTIVATOR_REQUESTS.labels("timeout").inc()
            return error_response(503, str(error), "service_unavailable")
        metrics.ACTIVATOR_WAIT_SECONDS.observe(time.monotonic() - started)
        metrics.ACTIVATOR_REQUESTS.labels("forwarded").inc()
        return await self._forward(request, url)

    async def _target(self, request: web.Request) -> Target:
        remote = request.remote or ""
        lookup = self.waker.caller_namespace
        return await asyncio.to_thread(
            target_from_host, request.host, lambda: lookup(remote) if remote else None
        )

    async def _ready_pod(self, target: Target, deadline: float) -> str:
        """A ready pod's URL (the service must exist and scale to zero; it is set from 0
        to 1 replica while none is ready)."""
        try:
            return await self.wake_ups.ready_pod(target, deadline - time.monotonic())
        except TimeoutError:
            limit = self.settings.timeout_seconds
            raise NoPod(
                f"no replica of {target.namespace}/{target.name} became ready within "
                f"{limit:g} s of this request"
            ) from None

    async def _healthy(self, url: str) -> bool:
        try:
            async with self.session.get(url + "/health", timeout=HEALTH_TIMEOUT) as reply:
                return reply.status == 200
        except (TimeoutError, aiohttp.ClientError):
            return False

    async def _forward(self, request: web.Request, url: str) -> web.StreamResponse:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        async with self.session.request(
            request.method,
            url + request.path_qs,
            headers=headers,
            data=await request.read(),
            timeout=FORWARD_TIMEOUT,
            allow_redirects=False,
        ) as upstream:
            kept = {k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP}
            reply = web.StreamResponse(status=upstream.status, headers=kept)
            await reply.prepare(request)
            async for chunk in upstream.content.iter_any():
                await reply.write(chunk)
            await reply.write_eof()
            return reply

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(auto_decompress=False)
        return self._session


def serve_in_thread(activator: Activator, port: int, host: str = "0.0.0.0") -> None:
    """Serve the activator on its own event loop and thread; returns once it listens."""
    listening, failed = threading.Event(), []

    async def serve() -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", activator.handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, host, port).start()
        except OSError as error:  # e.g. the port is taken: say so at start-up
            failed.append(error)
            listening.set()
            return
        logger.info("activator listening on %s:%d", host, port)
        listening.set()
        await asyncio.Event().wait()

    threading.Thread(target=asyncio.run, args=(serve(),), name="activator", daemon=True).start()
    if not listening.wait(timeout=30) or failed:
        raise OSError(f"the activator cannot listen on {host}:{port}: {failed or 'timeout'}")
