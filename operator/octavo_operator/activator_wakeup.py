"""One wake-up per service, shared by every request the activator holds for it.

Held requests do not poll the API server each: the first request for a service starts one
poller (an asyncio task); the others join it and wait on its result. Each tick the poller
reads the service once (it must exist and scale to zero), lists its pods once, returns the
first ready pod that answers /health, else sets replicas 0 -> 1 and sleeps. So N held
requests cost the API server the same two calls a tick as one. The poller stops when its
last waiter has gone (each waits at most its own activation timeout), and a finished
wake-up is forgotten: the next request after it starts a fresh one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from octavo_operator.activator_target import Target, UnknownTarget
from octavo_operator.api.service import InferenceService

logger = logging.getLogger(__name__)
HealthCheck = Callable[[str], Awaitable[bool]]


class Waker(Protocol):
    """The API calls a wake-up makes (activator_waker.ServiceWaker; blocking)."""

    def read(self, target: Target) -> dict | None: ...
    def wake(self, body: dict) -> bool: ...
    def ready_pod_urls(self, target: Target) -> list[str]: ...


class WakeUp:
    """The shared poller of one service and the requests waiting on it."""

    def __init__(self, target: Target, waker: Waker, healthy: HealthCheck, poll: float) -> None:
        self.target, self.waker, self.healthy, self.poll = target, waker, healthy, poll
        self.ready: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.waiters = 0
        self.stopped = False  # its last waiter left before a pod was ready
        self.task = asyncio.create_task(self._run(), name=f"wake-up {target}")

    @property
    def joinable(self) -> bool:
        return not (self.stopped or self.task.done())

    async def wait(self, timeout: float) -> str:
        """A ready pod's URL; TimeoutError after TIMEOUT seconds."""
        self.waiters += 1
        try:
            return await asyncio.wait_for(asyncio.shield(self.ready), max(timeout, 0.0))
        finally:
            self.waiters -= 1
            if self.waiters == 0 and not self.ready.done():
                self.stopped = True  # nobody waits any more: stop calling the API
                self.task.cancel()

    async def _run(self) -> None:
        try:
            self.ready.set_result(await self._poll())
        except Exception as error:  # every waiter gets it (UnknownTarget: a 404)
            self.ready.set_exception(error)

    async def _poll(self) -> str:
        first = True
        while True:
            body = await asyncio.to_thread(self.waker.read, self.target)
            self._check(body, first)
            for url in await asyncio.to_thread(self.waker.ready_pod_urls, self.target):
                if await self.healthy(url):
                    return url
            await asyncio.to_thread(self.waker.wake, body)
            first = False
            await asyncio.sleep(self.poll)

    def _check(self, body: dict | None, first: bool) -> None:
        namespace, name = self.target.namespace, self.target.name
        if body is None and first:
            raise UnknownTarget(f"no InferenceService {name} in {namespace}")
        if body is None:
            raise UnknownTarget(f"{namespace}/{name} was deleted")
        if not InferenceService.from_body(body).scales_to_zero:
            raise UnknownTarget(
                f"{namespace}/{name} does not scale to zero (autoscaling.minReplicas 0): the "
                "activator does not start it"
            )


class WakeUps:
    """The running wake-up of each service (on the activator's event loop only)."""

    def __init__(self, waker: Waker, healthy: HealthCheck, poll_seconds: float) -> None:
        self.waker, self.healthy, self.poll_seconds = waker, healthy, poll_seconds
        self.running: dict[Target, WakeUp] = {}

    async def ready_pod(self, target: Target, timeout: float) -> str:
        """Join the service's wake-up (or start it) and wait for a ready pod's URL;
        TimeoutError after TIMEOUT seconds."""
        wake_up = self.running.get(target)
        if wake_up is None or not wake_up.joinable:
            wake_up = WakeUp(target, self.waker, self.healthy, self.poll_seconds)
            self.running[target] = wake_up
            wake_up.task.add_done_callback(lambda _: self._forget(target, wake_up))
        return await wake_up.wait(timeout)

    def _forget(self, target: Target, wake_up: WakeUp) -> None:
        if self.running.get(target) is wake_up:
            del self.running[target]
