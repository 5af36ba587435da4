"""Requests that wait for capacity: joining the line, waiting for a grant, passing over lines."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from functools import partial
from typing import Any, TypeVar

from quota_ledger.driver import line_notices
from quota_ledger.driver.tx import LedgerTx
from quota_ledger.driver.waiting_line import Waiting
from quota_ledger.engine.base import DEFAULT_PARTITION, EngineBase
from quota_ledger.engine.granter import Granter
from quota_ledger.ledger import waiting
from quota_ledger.ledger.group_decision import Refused
from quota_ledger.model import queues, validation
from quota_ledger.model.errors import (
    DatabaseUnavailable,
    InvalidRequest,
    OverQuota,
    QuotaLedgerError,
    ReservationNotFound,
    WaitTimeout,
)
from quota_ledger.model.requests import ReserveRequest
from quota_ledger.model.values import Reservation, ReservationState

log = logging.getLogger(__name__)
T = TypeVar("T")

#: the default of ``QuotaEngine(wait_poll_interval=...)``, seconds
DEFAULT_WAIT_POLL_INTERVAL = 0.25
#: the largest priority (a 32-bit column)
MAX_PRIORITY = 2**31 - 1
#: the longest wait, seconds (a year)
MAX_WAIT = 365 * 24 * 3600.0


def wait_seconds(wait: Any, field: str = "wait") -> float:
    """A wait in seconds (a positive finite number of seconds, or a ``timedelta``)."""
    if isinstance(wait, timedelta):
        seconds = wait.total_seconds()
    elif isinstance(wait, int | float) and not isinstance(wait, bool):
        seconds = float(wait)
    else:
        raise InvalidRequest(f"{field} must be a number of seconds or a timedelta", field=field)
    if not math.isfinite(seconds) or seconds <= 0 or seconds > MAX_WAIT:
        raise InvalidRequest(f"{field} must be more than 0 and at most {MAX_WAIT:.0f} seconds", field=field)
    return seconds


def priority(value: Any) -> int:
    """A waiting request's priority: an integer within 32 bits."""
    if isinstance(value, bool) or not isinstance(value, int) or abs(value) > MAX_PRIORITY:
        raise InvalidRequest(
            f"priority must be an integer between -{MAX_PRIORITY} and {MAX_PRIORITY}", field="priority"
        )
    return value


def how_to_wait(wait: Any, block: Any, rank: Any) -> tuple[float | None, int]:
    """The checked ``wait`` (seconds; None: decide at once) and ``priority`` of a reserve, and
    its ``block`` flag checked: what :meth:`~Reservations.reserve` and ``explain`` accept."""
    validation.flag(block, "block")
    seconds = None if wait is None else wait_seconds(wait)
    checked = priority(rank)
    if seconds is None and checked != 0:
        raise InvalidRequest("priority orders the requests that wait: pass wait= too", field="priority")
    return seconds, checked


class Waits(EngineBase):
    """The waiting-line calls of :class:`QuotaEngine`."""

    granter: Granter

    def wait_for(self, reservation_id: str, timeout: float | timedelta) -> Reservation:
        """Block until the waiting request ``reservation_id`` leaves its line (granted:
        ``pending``; cancelled: ``rolled_back``; its wait ran out: ``expired``) or ``timeout``
        runs out; the reservation as it is then (still ``waiting``, with its ``position``,
        when the timeout ran out first). A reservation that does not wait is returned at once."""
        rid = validation.reservation_id(reservation_id)
        seconds = wait_seconds(timeout, "timeout")
        current = self._placed(rid)
        if current.state is not ReservationState.WAITING:
            return current
        left, _ = self.granter.wait(rid, current.partition, seconds)
        return left if left is not None else self._placed(rid)

    def waiting(
        self, queue: str | None = None, *, partition: str = DEFAULT_PARTITION, limit: int = 1000
    ) -> list[Reservation]:
        """The waiting requests of ``queue``'s subtree (or of the whole partition), in the order
        they are tried (priority, then arrival), each with its ``position`` in the partition's
        line and what it asks for; at most ``limit`` (up to 1000) of the line's first."""
        validation.partition(partition)
        if queue is not None:
            validation.queue(queue)
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= waiting.PASS_LIMIT:
            raise InvalidRequest(f"limit must be an integer from 1 to {waiting.PASS_LIMIT}", field="limit")
        found = self.driver.run(lambda tx: tx.line_reservations(partition, limit), read_only=True)
        return [r for r in found if queue is None or queues.in_subtree(r.queue, queue)]

    def grant_waiting(self, *, partition: str | None = None) -> list[Reservation]:
        """Pass over the waiting lines (of ``partition``, or of every partition) once, now:
        the requests granted. Requests whose wait ran out leave their line as ``expired``. The
        engine does this by itself whenever it frees capacity, and the sweep does it too; call
        it after capacity was freed by means the ledger does not see."""
        wanted = validation.optional_partition(partition)
        names = self._lines(wanted)
        for name in names:
            while self.driver.run(partial(waiting.end_run_out, partition=name, limit=waiting.PASS_LIMIT)):
                pass
        granted: list[Reservation] = []
        for name in names:
            for outcome in self._pass(name, "sweep").values():
                if isinstance(outcome, Reservation) and outcome.state is ReservationState.PENDING:
                    granted.append(outcome)
        return granted

    def _join_behind(self, request: ReserveRequest, wait: float, place: bool) -> Reservation | None:
        """``request`` in line behind the requests that wait in its partition already, undecided
        (or what its key made already); None when none waits: it is decided at once. Without
        ``place``, its ``position`` is not read."""
        return self.driver.run(lambda tx: waiting.join_behind(tx, self.rules, request, wait, place))

    def _queued(
        self, joined: Reservation, deadline: float | None, violations: Sequence[Any] = ()
    ) -> Reservation:
        """A request that joined behind others: the granter's thread passes over its line now,
        in order; with a ``deadline``, waited for as :meth:`_await` waits (``violations``: what
        stopped it, if it was tried)."""
        self.granter.kick(joined.partition, "join")
        if deadline is None:
            return joined
        return self._await(joined, violations, deadline, try_now=False)

    def _wait_in_line(
        self, request: ReserveRequest, refused: OverQuota, wait: float, block: bool, started: float
    ) -> Reservation:
        """``request`` was refused: put it in line for ``wait`` seconds from ``started``
        (monotonic); with ``block``, wait for it to be granted (:class:`WaitTimeout` when the
        wait runs out first)."""
        joined = self.driver.run(lambda tx: waiting.join(tx, self.rules, request, wait, refused.violations))
        if joined.state is not ReservationState.WAITING:
            return joined  # its key made it already
        self.granter.noted(joined.partition)  # what this engine frees next passes over its line
        deadline = started + wait if block else None
        if joined.position is not None and joined.position > 1:
            # Others joined meanwhile, ahead of it: trying it alone now could pass them.
            return self._queued(joined, deadline, refused.violations)
        return self._await(joined, refused.violations, deadline)

    def _await(
        self, current: Reservation, violations: Sequence[Any], deadline: float | None, try_now: bool = True
    ) -> Reservation:
        """A waiting ``current``, tried once more now (unless not ``try_now``: a pass of the
        granter tries it in order); with a ``deadline`` (monotonic), waited for until then, when
        it leaves the line as expired and :class:`WaitTimeout` is raised."""
        if try_now:
            outcome = self.driver.run(lambda tx: waiting.grant(tx, self.rules, self.bounds, current.id))
            if isinstance(outcome, waiting.Granted):
                self.granter.stats.granted("join", outcome.waited)
                return outcome.reservation
            if isinstance(outcome, Reservation) and outcome.state is not ReservationState.WAITING:
                return outcome
            if isinstance(outcome, Refused) and isinstance(outcome.error, OverQuota):
                violations = outcome.error.violations
            if deadline is None:
                return self._placed(current.id)
        if deadline is None:
            return current
        left, last = self.granter.wait(current.id, current.partition, max(0.0, deadline - time.monotonic()))
        violations = last or violations
        if left is not None and left.state is not ReservationState.EXPIRED:
            return left
        if left is not None:  # its wait ran out and a pass ended it first
            raise WaitTimeout(current.id, list(violations))
        if self.granter.closed:
            raise DatabaseUnavailable(
                "the engine was closed while a request waited in line; it waits on until its wait "
                f"runs out: {current.id}"
            )

        def expire(tx: LedgerTx) -> tuple[Reservation, bool]:
            locked = tx.lock_reservation(current.id)
            if locked is None:
                raise ReservationNotFound(current.id)
            stored, now = locked
            if stored.reservation.state is not ReservationState.WAITING:
                return stored.reservation, False  # granted (or cancelled) meanwhile
            return waiting.leave(tx, stored.reservation, ReservationState.EXPIRED, now), True

        ended, ran_out = self.driver.run(expire)
        if ran_out:
            raise WaitTimeout(current.id, list(violations))
        return ended

    def _placed(self, reservation_id: str) -> Reservation:
        found = self.driver.run(lambda tx: _read_placed(tx, reservation_id))
        if found is None:
            raise ReservationNotFound(reservation_id)
        return found

    def _pass(self, partition: str, reason: str = "pass") -> dict[str, Reservation | Refused | None]:
        """One pass over ``partition``'s line: each request tried in order, in a transaction
        of its own; its grants counted under ``reason`` (what freed the capacity)."""
        outcomes: dict[str, Reservation | Refused | None] = {}
        refused: list[Waiting] = []
        for each in self._line(partition):
            if any(waiting.no_smaller(each, other) for other in refused):
                continue  # it asks for no less than one refused in this pass, as the same caller
            rid = each.id
            self.granter.deciding(rid)
            outcome: waiting.Granted | waiting.Over | Reservation | Refused | None = None
            try:
                outcome = self.paths.grant(each)
            except QuotaLedgerError as error:  # the next pass tries it again; the others go on
                log.warning("waiting request %s was not tried: %s", rid, error)
                continue
            finally:
                self.granter.decided(rid, _left_by(outcome))
            if isinstance(outcome, Refused | waiting.Over):
                refused.append(each)
            if isinstance(outcome, waiting.Over):
                continue  # (refused; what stopped it was not read again)
            if isinstance(outcome, waiting.Granted):
                self.granter.stats.granted(reason, outcome.waited)
                if outcome.full:  # the same again would be refused: so is what asks no less
                    refused.append(each)
                outcome = outcome.reservation
            outcomes[rid] = outcome
        return outcomes

    def _line(self, partition: str) -> Iterator[Waiting]:
        """``partition``'s line in grant order, for a pass, each request once: its first
        :data:`waiting.PASS_FIRST` requests, then, if the pass gets through them all, the others
        of its first :data:`waiting.PASS_LIMIT` (a pass that stops early reads few rows)."""
        first = self.driver.run(lambda tx: tx.line_rows(partition, waiting.PASS_FIRST))
        yield from first
        if len(first) == waiting.PASS_FIRST:
            seen = {each.id for each in first}
            rest = self.driver.run(lambda tx: tx.line_rows(partition, waiting.PASS_LIMIT))
            yield from (each for each in rest if each.id not in seen)

    def _lines(self, partition: str | None) -> list[str]:
        """The partitions with a line: ``partition``, if it has one; None: of every partition."""
        names = [partition] if partition is not None else self.driver.partitions()
        # On the writer: a replica that lags would not show a line just joined.
        return self.driver.run(lambda tx: [name for name in names if tx.has_line(name)])

    def _read_many(self, ids: Sequence[str]) -> dict[str, Reservation]:
        def read(tx: LedgerTx) -> dict[str, Reservation]:
            return {found.reservation.id: found.reservation for found in tx.find_reservations(ids)}

        return self.driver.run(read)

    def _free(self, step: Callable[[LedgerTx], T], reason: str) -> tuple[T, bool]:
        """Run ``step`` (a rollback, a release) in a transaction of its own. On PostgreSQL, when
        the partition it freed capacity in has a line (:meth:`_grants_in`), and no line of it
        is ``StrictFIFO``, the same transaction then grants the first request of the line if it
        now fits (:func:`waiting.grant_head`): the grant commits with the freeing, in one commit,
        and its caller here is woken at once. The line needs no pass when the transaction left
        every counter with no less in use plus reserved than it found: nothing was freed that
        no request fitted in before (best effort first-in first-out grants whatever fits)."""
        granted: list[waiting.Granted] = []
        tried: list[bool] = []
        deciding: list[str] = []  # (a request granted in an attempt: its notice waits for it)

        def work(tx: LedgerTx) -> tuple[T, bool]:
            granted.clear()
            value = step(tx)
            if (
                not isinstance(value, Reservation)
                or not tx.freed()
                or not self._grants_in(tx, value.partition)
            ):
                return value, True
            tried.append(True)
            outcome = waiting.grant_head(tx, self.rules, self.bounds, value.partition)
            if outcome is None:
                return value, True
            granted.append(outcome)
            self.granter.deciding(outcome.reservation.id)
            deciding.append(outcome.reservation.id)
            # (the rules the grant decided by, or newer: a line made strict meanwhile is passed)
            return value, tx.freed() or self._strict(tx, value.partition)

        committed: dict[str, Reservation] = {}
        try:
            value, passes = self.driver.run(work)
        except DatabaseUnavailable:
            raise
        except QuotaLedgerError as error:
            if not tried:
                raise
            # The grant failed the transaction (a database error it met, not the freeing's): the
            # freeing alone, again (it did not commit), and a pass grants.
            log.warning("a grant in a freeing transaction failed, freeing alone: %s", error)
            return self.driver.run(step), True
        else:
            for outcome in granted:
                self.granter.stats.granted(reason, outcome.waited)
                committed[outcome.reservation.id] = outcome.reservation
        finally:
            for rid in deciding:  # its callers woken (a grant that committed), or its notice heard
                self.granter.decided(rid, committed.pop(rid, None))
        return value, passes

    def _grants_in(self, tx: LedgerTx, partition: str) -> bool:
        """Whether a freeing transaction in ``partition`` grants its line's first request
        itself: PostgreSQL, a partition with a line, and no ``StrictFIFO`` queue. Whether it
        has a line is what this engine saw within its poll interval, else read in ``tx`` (one
        index lookup, which the freeing call would otherwise make after its commit)."""
        if self.driver.backend != "postgresql":
            return False
        has_line = self.granter.line_known(partition)
        if has_line is None:
            has_line = tx.has_line(partition)
            self.granter.saw(partition, has_line)
        return has_line and not self._strict(tx, partition)

    def _strict(self, tx: LedgerTx, partition: str) -> bool:
        """Whether ``partition`` has a ``StrictFIFO`` queue, by the newest rules compiled (in
        ``tx``, the first time)."""
        return self.rules.known(lambda read: read(tx)).partition(partition).has_strict_lines

    def _freed(self, partition: str | None, reason: str) -> None:
        """Capacity was freed in ``partition`` (None: anywhere) by ``reason``: its line, if it
        has one, is passed over soon, by the granter's thread."""
        self.granter.freed(partition, reason)

    def _make_granter(self, interval: float) -> Granter:
        listen = None
        if self.driver.backend == "postgresql":
            listen = partial(line_notices.Listener, self.driver.engine, retry=interval)
        return Granter(
            self._pass,
            self._read_many,
            self._lines,
            interval,
            listen,
        )


def _read_placed(tx: LedgerTx, reservation_id: str) -> Reservation | None:
    found = tx.find_reservation(reservation_id)
    return None if found is None else waiting.placed(tx, found.reservation)


def _left_by(outcome: object) -> Reservation | None:
    """The reservation a pass's decision made leave its line (a grant), if it did."""
    return outcome.reservation if isinstance(outcome, waiting.Granted) else None
