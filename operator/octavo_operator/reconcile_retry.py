"""Reconciles that kopf does not retry: a drift correction and the reconcile an optional
API's arrival starts. A transient failure of one (an apiserver timeout under load) is tried
again RETRY_DELAY_SECONDS later, until a reconcile of the service goes through or the
service is gone. Without the retry the child stayed drifted: a service whose last reconcile
failed reads no drift (Controller.drifted), and nothing else reconciles it until its spec
changes."""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from octavo_operator.reconcile import Controller, Key, TransientError

logger = logging.getLogger(__name__)

RETRY_DELAY_SECONDS = 30.0  # as kopf's retry of a failed create/update/resume handler


def _nothing() -> None:
    return None


@dataclass
class RetriedReconcile:
    """One reconcile of KEY that retries itself on a drift-check thread when it fails."""

    ctl: Controller
    key: Key
    find_owner: Callable[[], dict[str, Any] | None]  # the service's newest body, or None
    trigger: str
    after_retry: Callable[[], None] = field(default=_nothing)  # e.g. a status rewrite

    def run(self, owner: dict[str, Any]) -> None:
        """Reconcile OWNER now (the caller holds the service's lock)."""
        try:
            self.ctl.reconcile(owner, trigger=self.trigger)
        except TransientError as error:
            logger.warning(
                "%s reconcile of %s/%s failed, again in %.0f s: %s",
                self.trigger,
                *self.key,
                RETRY_DELAY_SECONDS,
                error,
            )
            self._schedule()

    def _schedule(self) -> None:
        context = contextvars.copy_context()  # kopf's, for the Events a status write posts
        timer = threading.Timer(RETRY_DELAY_SECONDS, self._submit, args=(context,))
        timer.daemon = True
        timer.start()

    def _submit(self, context: contextvars.Context) -> None:
        try:
            self.ctl.drift_checks.submit(context.run, self._retry)
        except RuntimeError:  # the executor shut down: the operator is stopping
            logger.info("retry of %s/%s dropped: shutting down", *self.key)

    def _retry(self) -> None:
        with self.ctl.lock(self.key):
            owner = self.find_owner()
            applied = self.ctl.applied.get(self.key)
            if owner is None or applied is None or applied.error is None:
                return  # deleted, forgotten, or a later reconcile went through
            self.run(owner)
        self.after_retry()
