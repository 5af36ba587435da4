"""The engine's granter: one thread that tries the waiting lines again, and wakes the callers
blocked until their request leaves its line.

Whatever frees capacity in this engine (a rollback, a partial commit, a release, a limit
change) kicks the granter for its partition when the partition has a line; so does a request
that joins one. The granter then passes over that line (:func:`ledger.waiting.grant`, one
transaction per request tried, in order). On PostgreSQL a rollback or a release may grant the
first request of the line in its own transaction instead (:meth:`.waiting.Waits._free`); it
hands that grant to :meth:`Granter.delivered`. While callers of this engine are blocked, the
granter also passes over their lines every ``interval`` seconds, so capacity freed by another
process, or by one that died right after freeing it, is granted within that time. What a pass
grants wakes its callers at once; each round first reads the blocked callers' rows, in one
statement, to wake those whose request left its line, whoever granted it (on PostgreSQL, only
while the listener below does not listen, or when a notice names no request). Without blocked
callers and kicks the thread sleeps; it is started when first needed.

On PostgreSQL a request that leaves its line notifies (``LISTEN``/``NOTIFY``, sent when the
transaction that granted, cancelled or expired it commits): the granter listens on a connection
of its own while it runs. A notice that names a request a caller here is blocked on wakes that
caller, which reads its row again on its own thread, unless this engine is deciding that
request itself (then its decision wakes the caller without a read, or, if it did not make the
request leave, the notice is heard then); one that names no request (an expiry of many, or the
listener starting to listen again) has the granter read every blocked caller's row. Each
blocked caller waits on an event of its own: a grant wakes its callers only, not every blocked
thread.

Whether a partition has a line is read from the database (one index lookup) at most once per
``interval``, by the freeing call that finds the engine's knowledge stale (on PostgreSQL in its
own transaction, which then grants): a partition without a line costs a freeing call nothing
else.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from quota_ledger.ledger.group_decision import Refused
from quota_ledger.model.errors import OverQuota, QuotaLedgerError
from quota_ledger.model.values import Reservation, ReservationState, Violation

log = logging.getLogger(__name__)

#: one pass over a partition's line, and why: the outcome of each request tried, by id
Pass = Callable[[str, str], dict[str, Reservation | Refused | None]]
#: the upper bounds of the wait-time histogram, seconds
WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)


class WaitStats:
    """What this engine granted: grants by what freed the capacity (``rollback``, ``commit``,
    ``release``, ``limits``, ``configuration``, ``sweep``, ``poll``: found by a periodic pass,
    ``join``: at once after joining, ``pass``: by ``grant_waiting``), and how long the requests
    waited (a histogram, for the service's metrics)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.grants: dict[str, int] = {}
        #: requests granted after waiting at most each bound of :data:`WAIT_BUCKETS`
        self.buckets = [0] * len(WAIT_BUCKETS)
        self.count = 0
        self.total = 0.0

    def granted(self, reason: str, waited: float) -> None:
        with self._lock:
            self.grants[reason] = self.grants.get(reason, 0) + 1
            for n, bound in enumerate(WAIT_BUCKETS):
                if waited <= bound:
                    self.buckets[n] += 1
            self.count += 1
            self.total += waited

    def snapshot(self) -> tuple[dict[str, int], list[int], int, float]:
        """(grants by reason, cumulative bucket counts, count, sum of waits)."""
        with self._lock:
            return dict(self.grants), list(self.buckets), self.count, self.total


#: the rows of some reservations, as stored now
Read = Callable[[Sequence[str]], dict[str, Reservation]]
#: the partitions with a line, of one partition or (None) of every partition
Lines = Callable[[str | None], list[str]]


class Listening(Protocol):
    #: whether it listens now
    live: bool

    def close(self) -> None: ...


class Granter:
    """See the module. ``passes`` runs one pass over a partition's line, ``read`` reads
    reservations, ``lines`` lists the partitions with a line."""

    def __init__(
        self,
        passes: Pass,
        read: Read,
        lines: Lines,
        interval: float,
        listen: Callable[[Callable[[str | None, str | None], None]], Listening] | None = None,
    ) -> None:
        self.passes = passes
        self.read = read
        self.stats = WaitStats()
        #: starts listening for notices of requests that left a line (PostgreSQL), if given
        self.listen = listen
        self._listener: Listening | None = None
        #: since the last round: whether a notice named no request (every blocked caller's row
        #: is read again), and the requests the others named
        self._heard_all = False
        self._heard_ids: set[str] = set()
        #: blocked callers a notice named: each reads its row again itself
        self._recheck: set[str] = set()
        #: requests this engine is deciding now (a pass, a freeing call), how many times: a
        #: notice that names one is held until the decision is over (:meth:`decided`)
        self._deciding: dict[str, int] = {}
        #: the partitions of the notices held, by request
        self._held: dict[str, str] = {}
        self.lines = lines
        self.interval = interval
        #: guards the state below; the granter's thread waits on it for work
        self._cond = threading.Condition()
        #: what each blocked caller waits on: set when its request left its line (or on close),
        #: so that a grant wakes its own callers only, not every blocked thread
        self._events: dict[str, threading.Event] = {}
        #: blocked callers: reservation id -> partition
        self._blocked: dict[str, str] = {}
        #: how the requests of blocked callers left their line
        self._left: dict[str, Reservation] = {}
        #: callbacks of watchers (the service's long polls): reservation id -> callbacks
        self._watchers: dict[str, list[Callable[[Reservation], None]]] = {}
        #: the limits that stopped each blocked caller's request when it was last tried
        self._refusals: dict[str, list[Violation]] = {}
        #: partition -> what freed capacity there (its line is passed over next round)
        self._kicked: dict[str, str] = {}
        #: how many callers of :meth:`wait` wait for each reservation
        self._waits: dict[str, int] = {}
        #: partition -> when it was last seen to have a line or not, and whether it had one
        self._seen: dict[str, tuple[float, bool]] = {}
        self._thread: threading.Thread | None = None
        self._closed = False

    def freed(self, partition: str | None, reason: str = "pass") -> None:
        """Capacity was freed in ``partition`` (None: anywhere, as by a new configuration): pass
        over its line, or every line, if there is one."""
        now = time.monotonic()
        if partition is not None:
            checked, has_line = self._seen.get(partition, (float("-inf"), False))
            if now - checked < self.interval:
                if has_line:
                    self.kick(partition, reason)
                return
        try:
            found = self.lines(partition)
        except QuotaLedgerError:  # the freeing call succeeded; the next one looks again
            return
        if partition is not None:
            self._seen[partition] = (now, bool(found))
        for name in found:
            self.kick(name, reason)

    def kick(self, partition: str, reason: str = "pass") -> None:
        """Pass over ``partition``'s line soon (``reason``: what freed capacity there)."""
        with self._cond:
            self._seen[partition] = (time.monotonic(), True)
            self._kicked[partition] = reason
            self._start()
            self._cond.notify_all()

    def wait(
        self, reservation_id: str, partition: str, timeout: float
    ) -> tuple[Reservation | None, list[Violation] | None]:
        """Block until the waiting request ``reservation_id`` leaves its line (how it left)
        or ``timeout`` seconds pass, or the engine closes (None); and the limits that stopped it
        when a pass of this granter last tried it (None: none did)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._waits[reservation_id] = self._waits.get(reservation_id, 0) + 1
            event = self._events.setdefault(reservation_id, threading.Event())
            self._blocked[reservation_id] = partition
            self._kicked.setdefault(partition, "poll")
            self._start()
            self._cond.notify_all()
        try:
            while True:
                with self._cond:
                    if reservation_id in self._left:
                        return self._left[reservation_id], self._refusals.get(reservation_id)
                    left = deadline - time.monotonic()
                    if left <= 0 or self._closed:
                        return None, self._refusals.get(reservation_id)
                    recheck = reservation_id in self._recheck
                    if recheck:
                        self._recheck.discard(reservation_id)
                        event.clear()
                if recheck and self._reread(reservation_id):
                    continue
                event.wait(left)
        finally:
            with self._cond:
                self._waits[reservation_id] -= 1
                if not self._waits[reservation_id]:
                    del self._waits[reservation_id]
                    del self._events[reservation_id]
                    self._recheck.discard(reservation_id)
                    self._left.pop(reservation_id, None)
                    self._refusals.pop(reservation_id, None)
                    if reservation_id not in self._watchers:
                        self._blocked.pop(reservation_id, None)

    def watch(
        self, reservation_id: str, partition: str, left: Callable[[Reservation], None]
    ) -> Callable[[], None]:
        """Call ``left`` (from the granter's thread) with the reservation when the waiting
        request ``reservation_id`` leaves its line; the function returned stops watching. A
        watcher holds no thread: the service's long polls wait on it."""
        with self._cond:
            self._watchers.setdefault(reservation_id, []).append(left)
            self._blocked.setdefault(reservation_id, partition)
            self._kicked.setdefault(partition, "poll")
            self._start()
            self._cond.notify_all()

        def stop() -> None:
            with self._cond:
                callbacks = self._watchers.get(reservation_id, [])
                if left in callbacks:
                    callbacks.remove(left)
                if not callbacks:
                    self._watchers.pop(reservation_id, None)
                    if reservation_id not in self._waits:
                        self._blocked.pop(reservation_id, None)

        return stop

    def line_known(self, partition: str) -> bool | None:
        """Whether ``partition`` was seen to have a line within the last ``interval`` (None:
        not seen within it: ask the database)."""
        checked, has_line = self._seen.get(partition, (float("-inf"), False))
        return has_line if time.monotonic() - checked < self.interval else None

    def saw(self, partition: str, has_line: bool) -> None:
        """``partition`` was just seen to have a line, or none (read in the database)."""
        with self._cond:
            self._seen[partition] = (time.monotonic(), has_line)

    def deciding(self, reservation_id: str) -> None:
        """This engine is deciding the waiting request ``reservation_id`` (a grant it commits
        notifies too): a notice that names it waits for :meth:`decided`."""
        with self._cond:
            self._deciding[reservation_id] = self._deciding.get(reservation_id, 0) + 1

    def decided(self, reservation_id: str, outcome: Reservation | None) -> None:
        """The decision :meth:`deciding` announced is over: ``outcome`` is the request as it
        left its line by it (committed: its callers here are woken without a read), or None
        when it did not leave by it; then a notice held for it is heard now."""
        if outcome is not None:
            self.delivered(outcome)
        with self._cond:
            left = self._deciding[reservation_id] - 1
            if left:
                self._deciding[reservation_id] = left
                return
            del self._deciding[reservation_id]
            partition = self._held.pop(reservation_id, None)
        if partition is not None and outcome is None:
            self.heard(partition, reservation_id)

    def delivered(self, reservation: Reservation) -> None:
        """A request this engine made leave its line (a grant committed): wake its callers and
        watchers here at once, without a read."""
        with self._cond:
            self._seen[reservation.partition] = (time.monotonic(), True)
        self._woken({reservation.id: reservation})

    def noted(self, partition: str) -> None:
        """A request of ``partition`` joined its line: the next capacity this engine frees
        there passes over it (no look in the database first)."""
        with self._cond:
            self._seen[partition] = (time.monotonic(), True)

    @property
    def closed(self) -> bool:
        return self._closed

    def heard(self, partition: str | None, reservation_id: str | None = None) -> None:
        """A request of ``partition`` left its line (a notice, from any process): read again
        the row of ``reservation_id`` if a caller here waits for it (the blocked caller reads
        it itself, on its own thread), or, when the notice names no request, the rows of every
        caller blocked here (so too when the listener started listening: None)."""
        with self._cond:
            if reservation_id is None:
                self._heard_all = True
            elif reservation_id in self._deciding and partition is not None:
                self._held[reservation_id] = partition  # (its decision here delivers it)
                return
            elif reservation_id in self._waits:
                self._recheck.add(reservation_id)
                self._events[reservation_id].set()
                if reservation_id not in self._watchers:
                    return
                self._heard_ids.add(reservation_id)
            elif reservation_id in self._blocked:
                self._heard_ids.add(reservation_id)
            else:
                return
            self._cond.notify_all()

    def _reread(self, reservation_id: str) -> bool:
        """Read the row of a blocked caller's request (a notice named it); whether it left its
        line (then it is woken as a round would wake it)."""
        try:
            found = self.read([reservation_id]).get(reservation_id)
        except QuotaLedgerError:  # the next round reads it
            return False
        if found is None or found.state is ReservationState.WAITING:
            return False
        self._woken({reservation_id: found})
        return True

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            for event in self._events.values():
                event.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._listener is not None:
            self._listener.close()

    def _start(self) -> None:
        if self._thread is None and not self._closed:
            self._thread = threading.Thread(target=self._run, name="quota-ledger-granter", daemon=True)
            self._thread.start()
            if self.listen is not None:
                self._listener = self.listen(self.heard)

    def _run(self) -> None:
        polled = time.monotonic()
        while True:
            with self._cond:
                if not self._kicked and not self._heard_all and not self._heard_ids and not self._closed:
                    due = polled + self.interval - time.monotonic()
                    self._cond.wait(max(0.0, due) if self._blocked else None)
                closing = self._closed
                # Closing, the lines kicked are still passed over (what this engine freed last).
                partitions = dict(self._kicked)
                self._kicked.clear()
                heard, self._heard_all = self._heard_all, False
                heard_ids, self._heard_ids = self._heard_ids, set()
                if not closing and self._blocked and time.monotonic() - polled >= self.interval:
                    polled = time.monotonic()
                    for name in set(self._blocked.values()):
                        partitions.setdefault(name, "poll")
            # While the listener listens, a request that leaves its line is heard of: the
            # blocked callers' rows are read when a notice names no request, or names theirs.
            listening = self._listener is not None and self._listener.live
            try:
                if heard or (partitions and not listening):
                    self._round(partitions)
                elif partitions or heard_ids:
                    self._round(partitions, heard_ids)
            except Exception:  # the thread must outlive any one round; the next round retries
                log.exception("a pass over the waiting lines failed")
                if not closing:
                    time.sleep(self.interval)
            if closing:
                return

    def _round(self, partitions: dict[str, str], only: set[str] | None = None) -> None:
        """Read the rows of the callers blocked here (``only`` those of them, if given) and wake
        those whose request left its line, then pass over the lines of ``partitions``: a grant
        made elsewhere wakes its caller without waiting for a pass here, and what the passes
        grant wakes its callers at once, without a read."""
        with self._cond:
            blocked = [rid for rid in self._blocked if only is None or rid in only]
        if blocked:
            with contextlib.suppress(QuotaLedgerError):  # (the next round reads them again)
                self._woken(self.read(blocked))
        refusals: dict[str, list[Violation]] = {}
        for partition, reason in sorted(partitions.items()):
            try:
                outcomes = self.passes(partition, reason)
            except QuotaLedgerError as error:
                log.warning("the waiting line of partition %r was not passed over: %s", partition, error)
                continue
            for rid, outcome in outcomes.items():
                if isinstance(outcome, Refused) and isinstance(outcome.error, OverQuota):
                    refusals[rid] = outcome.error.violations
            self._woken({rid: o for rid, o in outcomes.items() if isinstance(o, Reservation)})
        with self._cond:
            self._refusals.update((rid, v) for rid, v in refusals.items() if rid in self._waits)

    def _woken(self, found: dict[str, Reservation]) -> None:
        """Wake the callers and watchers of the requests of ``found`` that left their line."""
        calls: list[tuple[Callable[[Reservation], None], Reservation]] = []
        with self._cond:
            for rid, reservation in found.items():
                if reservation.state is not ReservationState.WAITING and rid in self._blocked:
                    if rid in self._waits:
                        self._left[rid] = reservation
                        self._events[rid].set()
                    calls.extend((call, reservation) for call in self._watchers.pop(rid, []))
                    if rid not in self._waits:
                        self._blocked.pop(rid, None)
            self._cond.notify_all()
        for call, reservation in calls:
            try:
                call(reservation)
            except Exception:  # one watcher's failure (a closed event loop) leaves the others
                log.exception("a waiting request's watcher failed")
