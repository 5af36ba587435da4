"""Upkeep: the expiry sweep, the audit of every counter against the history, and pruning the
counters at zero that nothing references."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from quota_ledger.engine.base import EngineBase
from quota_ledger.ledger import audit, batches, expire, prune
from quota_ledger.model import validation
from quota_ledger.model.errors import QuotaLedgerError
from quota_ledger.model.values import Drift, IdleCounter, Reservation

log = logging.getLogger(__name__)


class Maintenance(EngineBase):
    """The expiry, audit and prune calls of :class:`QuotaEngine`."""

    if TYPE_CHECKING:
        # from Waits, which QuotaEngine combines with this class
        def grant_waiting(self, *, partition: str | None = None) -> list[Reservation]: ...

    def expire(
        self,
        *,
        batch_size: int = 500,
        max_batches: int | None = None,
        workers: int = 1,
        max_rate: float | None = None,
        set_aside: batches.SetAside | None = None,
    ) -> int:
        """Expire pending reservations whose time ran out; returns how many.

        Works in batches of ``batch_size``, one short transaction each, skipping rows another
        sweeper or a concurrent commit holds, so several sweepers (``workers`` threads here,
        or other processes) can run at once and an interrupted sweep loses nothing.
        ``max_batches`` bounds the batches of this call in all. ``max_rate`` holds the call to
        that many reservations per second on average (pausing between batches), so that a
        large backlog is worked off without taking the database from live traffic; None
        sweeps as fast as the database allows.

        A reservation whose expiry fails on its own does not stop the others: its batch is
        bisected, it is logged and remembered in ``set_aside`` (see
        :class:`~quota_ledger.ledger.batches.SetAside`; None: a new one, for this call only),
        and the calls given the same ``set_aside`` skip it.

        Then the waiting lines are passed over (:meth:`grant_waiting`): what the expiries freed
        is granted, and requests whose wait ran out leave their line as ``expired``.
        """
        validation.sweep_options(batch_size, max_batches, workers, max_rate)
        expired = expire.sweep(
            self.driver,
            self.rules,
            batch_size=batch_size,
            budget=batches.Budget(max_batches),
            workers=workers,
            pacer=batches.Pacer(max_rate),
            set_aside=set_aside if set_aside is not None else batches.SetAside(),
            by_function=self.paths.functions,
        )
        try:
            self.grant_waiting()
        except QuotaLedgerError as error:  # the expiries stand; the next sweep tries the lines again
            log.warning("the waiting lines were not passed over after the sweep: %s", error)
        return expired

    def audit(self, *, fix: bool = False, partition: str | None = None) -> list[Drift]:
        """Recompute every counter from the history and report those that disagree.

        The history is the journal of commits and releases (for ``in_use``) and the pending
        reservation items (for ``reserved``); the journal is checked in turn against the
        reservations it names (drifts of type ``commit`` or ``release``). With ``fix=True`` each
        partition is repaired under its exclusive lock and the drifts come back with
        ``fixed=True``, but for counters fed by a journal that holds more than its
        reservations say, which are left as they are.
        """
        validation.flag(fix, "fix")
        wanted = validation.optional_partition(partition)
        names = [wanted] if wanted is not None else self.driver.partitions()
        return audit.audit(self.driver, self.rules, names, fix)

    def prune(self, *, apply: bool = False, partition: str | None = None) -> list[IdleCounter]:
        """The counters at zero that nothing references, removed with ``apply=True``.

        A queue counter is kept while its queue is configured (or lies below a configured
        queue) and some limit names its resource, or a pending reservation names both; a user
        or group counter while the configuration names that user or group with a limit on its
        resource at its queue, or the user or group has a pending reservation or a running
        application; a ResourceQuota counter while its quota exists. The rest (what typos,
        departed users and removed queues leave) is listed and, with
        ``apply``, deleted: all or nothing, in one transaction that holds each partition's lock
        exclusively, so that no reservation can be using what goes. A later reservation
        creates again whatever it needs. Without ``apply`` nothing changes.
        """
        validation.flag(apply, "apply")
        wanted = validation.optional_partition(partition)
        # Only partitions that exist: locking one that does not would make its row.
        names = [name for name in self.driver.partitions() if wanted is None or name == wanted]
        if apply:
            return self.driver.run(lambda tx: prune.prune(tx, self.rules, names, True))
        return self.driver.run(
            lambda tx: prune.prune(tx, self.rules, names, False), isolation="REPEATABLE READ", read_only=True
        )
