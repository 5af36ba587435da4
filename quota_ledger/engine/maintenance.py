"""Upkeep: the expiry sweep and the audit of every counter against the history."""

from __future__ import annotations

from quota_ledger.engine.base import EngineBase
from quota_ledger.ledger import audit, batches, expire
from quota_ledger.model import validation
from quota_ledger.model.values import Drift


class Maintenance(EngineBase):
    """The expiry and audit calls of :class:`QuotaEngine`."""

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
        """
        validation.sweep_options(batch_size, max_batches, workers, max_rate)
        return expire.sweep(
            self.driver,
            self.rules,
            batch_size=batch_size,
            budget=batches.Budget(max_batches),
            workers=workers,
            pacer=batches.Pacer(max_rate),
            set_aside=set_aside if set_aside is not None else batches.SetAside(),
        )

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
