"""Leader election on a ``coordination.k8s.io/v1`` Lease, as client-go's leaderelection does it.

A candidate reads the Lease; it takes it when nobody holds it, or when the holder's record
(holder, renew time, version) has not changed for ``lease_duration`` seconds *as this candidate
observed it* (its own clock only, so clocks that disagree between nodes do not matter). The
holder renews it every ``retry_period`` seconds; every write carries the Lease's
``resourceVersion``, so of two candidates writing at once one gets 409 Conflict and stays a
follower. A holder that could not renew for ``renew_deadline`` seconds (less than
``lease_duration``) stops acting before anyone else may take over. Stopping, it gives the Lease
up, so that another replica takes over at once.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes.client.exceptions import ApiException

from quota_ledger.model.errors import InvalidRequest

log = logging.getLogger("quota_ledger.reconciler")

NOT_FOUND = 404
CONFLICT = 409


@dataclass(frozen=True, kw_only=True)
class LeaseConfig:
    """Which Lease, who competes for it, and its timing (seconds)."""

    name: str
    namespace: str
    identity: str
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.retry_period < self.renew_deadline < self.lease_duration:
            raise InvalidRequest(
                "leader election needs 0 < retry period < renew deadline < lease duration", field="lease"
            )


def _micro_time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """Competes for the Lease through ``api`` (a ``CoordinationV1Api``); :attr:`leading` is set
    while this candidate holds it."""

    def __init__(self, api: Any, config: LeaseConfig, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.api = api
        self.config = config
        self.clock = clock
        self.leading = threading.Event()
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self._renewed_at = 0.0

    def run(self, stop: threading.Event, changed: Callable[[bool], None] = lambda _: None) -> None:
        """Compete until ``stop`` is set, calling ``changed(True|False)`` as leadership comes and
        goes; give the Lease up when stopping."""
        while not stop.is_set():
            try:
                held = self.try_acquire_or_renew()
            except Exception as error:  # the API server unreachable: as a failed renewal
                log.warning("reconciler: lease %s: %s", self.config.name, error)
                held = False
            now = self.clock()
            if held:
                self._renewed_at = now
                if not self.leading.is_set():
                    log.info("reconciler: %s leads (lease %s)", self.config.identity, self.config.name)
                    self.leading.set()
                    changed(True)
            elif self.leading.is_set() and now - self._renewed_at >= self.config.renew_deadline:
                log.warning("reconciler: %s lost the lease %s", self.config.identity, self.config.name)
                self.leading.clear()
                changed(False)
            stop.wait(self.config.retry_period)
        if self.leading.is_set():
            self.leading.clear()
            changed(False)
            self.release()

    def try_acquire_or_renew(self) -> bool:
        """One round: True when this candidate holds the Lease afterwards."""
        cfg = self.config
        now = datetime.now(UTC)
        try:
            lease = json.loads(
                self.api.read_namespaced_lease(cfg.name, cfg.namespace, _preload_content=False).data
            )
        except ApiException as error:
            if error.status != NOT_FOUND:
                raise
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": cfg.name, "namespace": cfg.namespace},
                "spec": self._spec(now, now, 0),
            }
            return self._write(lambda: self.api.create_namespaced_lease(cfg.namespace, body))
        spec = lease.get("spec") or {}
        meta = lease.get("metadata") or {}
        holder = spec.get("holderIdentity") or ""
        record = (
            holder,
            spec.get("renewTime"),
            spec.get("leaseDurationSeconds"),
            meta.get("resourceVersion"),
        )
        if record != self._observed:
            self._observed, self._observed_at = record, self.clock()
        duration = float(spec.get("leaseDurationSeconds") or cfg.lease_duration)
        if holder and holder != cfg.identity and self.clock() - self._observed_at < duration:
            return False
        transitions = int(spec.get("leaseTransitions") or 0)
        if holder == cfg.identity:
            acquired = spec.get("acquireTime") or _micro_time(now)
        else:
            acquired, transitions = _micro_time(now), transitions + 1
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": cfg.name,
                "namespace": cfg.namespace,
                "resourceVersion": meta.get("resourceVersion"),
            },
            "spec": self._spec(acquired, now, transitions),
        }
        return self._write(lambda: self.api.replace_namespaced_lease(cfg.name, cfg.namespace, body))

    def release(self) -> None:
        """Give the Lease up (an empty holder), if this candidate still holds it."""
        cfg = self.config
        try:
            lease = json.loads(
                self.api.read_namespaced_lease(cfg.name, cfg.namespace, _preload_content=False).data
            )
            if (lease.get("spec") or {}).get("holderIdentity") != cfg.identity:
                return
            lease["spec"]["holderIdentity"] = None
            lease["spec"]["leaseDurationSeconds"] = 1
            self.api.replace_namespaced_lease(cfg.name, cfg.namespace, lease)
        except Exception as error:  # it expires by itself then
            log.info("reconciler: lease %s not given up: %s", cfg.name, error)

    def _spec(self, acquired: datetime | str, now: datetime, transitions: int) -> dict[str, Any]:
        return {
            "holderIdentity": self.config.identity,
            "leaseDurationSeconds": max(1, round(self.config.lease_duration)),
            "acquireTime": acquired if isinstance(acquired, str) else _micro_time(acquired),
            "renewTime": _micro_time(now),
            "leaseTransitions": transitions,
        }

    @staticmethod
    def _write(call: Callable[[], Any]) -> bool:
        try:
            call()
        except ApiException as error:
            if error.status == CONFLICT:
                return False  # another candidate wrote first
            raise
        return True
