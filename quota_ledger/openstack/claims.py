"""A claim: resources reserved for one request of a project, until it commits or rolls back."""

from __future__ import annotations

import logging
import threading

from quota_ledger.engine import QuotaEngine
from quota_ledger.model.errors import QuotaLedgerError
from quota_ledger.model.values import Reservation, ReservationState

log = logging.getLogger("quota_ledger.openstack")


class Claim:
    """What :meth:`Enforcer.claim <quota_ledger.openstack.enforcer.Enforcer.claim>` holds.

    Its resources count against the project's limits from the moment it is made (as
    ``reserved``), and as in use once committed. Committing or rolling back twice answers as
    the first time did; the ledger keeps the reservation's state, so a claim may also be
    resolved elsewhere by :attr:`id` (``engine.commit(id)``)."""

    def __init__(
        self, engine: QuotaEngine, reservation: Reservation, project_id: str, deltas: dict[str, int]
    ) -> None:
        self.engine = engine
        self.reservation = reservation
        self.project_id = project_id
        #: what was claimed, in Keystone's names and units
        self.deltas = deltas
        self._lock = threading.Lock()

    @property
    def id(self) -> str:
        """The ledger reservation's id."""
        return self.reservation.id

    @property
    def state(self) -> ReservationState:
        """The state as this claim last saw it."""
        return self.reservation.state

    def commit(self) -> Reservation:
        """Count what is held as in use (the resource now exists)."""
        with self._lock:
            if self.reservation.state is not ReservationState.COMMITTED:
                # a rolled-back or expired claim is refused by the ledger (ReservationStateError)
                self.reservation = self.engine.commit(self.reservation.id)
            return self.reservation

    def rollback(self) -> Reservation:
        """Release what is held (the request failed); a committed claim cannot be rolled back."""
        with self._lock:
            if self.reservation.state is ReservationState.PENDING:
                self.reservation = self.engine.rollback(self.reservation.id)
            elif self.reservation.state is ReservationState.COMMITTED:
                self.reservation = self.engine.rollback(self.reservation.id)  # refused by the ledger
            return self.reservation

    def close(self) -> None:
        """Commit what is still held: the block of a claim ended normally (a claim the block
        committed or rolled back itself stays as it is)."""
        if self.reservation.state is ReservationState.PENDING:
            self.commit()

    def abandon(self, error: BaseException) -> None:
        """Roll back because ``error`` ended the request; if even that fails, the reservation
        expires after its ttl, and ``error`` (raised by the caller) notes why."""
        if self.reservation.state is not ReservationState.PENDING:
            return
        try:
            self.rollback()
        except QuotaLedgerError as failed:
            log.warning("claim %s not rolled back (%s); it expires after its ttl", self.id, failed)
            error.add_note(f"claim {self.id} was not rolled back ({failed}); it expires after its ttl")

    def __repr__(self) -> str:
        return (
            f"Claim(id={self.id!r}, project_id={self.project_id!r}, deltas={self.deltas!r}, "
            f"state={self.state.value})"
        )
