"""Keeps a claimed run's lease alive while the worker works on it."""

from __future__ import annotations

import logging
import threading
from types import TracebackType

from django.conf import settings
from django.db import connection

from apps.runs.services import Claim, run_lease_renew

log = logging.getLogger(__name__)


class LeaseKeeper:
    """A thread renewing the lease every third of its length; sets `lost` when renewal fails
    (the run was cancelled or reaped) so the executor stops at its next check."""

    def __init__(self, claim: Claim, lost: threading.Event) -> None:
        self.claim, self.lost = claim, lost
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"lease-{claim.run_id}",
                                        daemon=True)

    def __enter__(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        interval = settings.INLINE_LEASE_SECONDS / 3
        try:
            while not self._stop.wait(interval):
                if not run_lease_renew(run_id=self.claim.run_id, attempt=self.claim.attempt):
                    self.lost.set()
                    return
        except Exception:  # a DB hiccup: stop renewing, the reaper decides
            log.exception("lease renewal for run %s failed", self.claim.run_id)
        finally:
            connection.close()
