"""Explanations: what :meth:`QuotaEngine.reserve` would decide now, and why, writing nothing."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from quota_ledger.driver.tx import LedgerTx, Undo
from quota_ledger.engine import waiting as waits
from quota_ledger.engine.base import DEFAULT_PARTITION, EngineBase
from quota_ledger.ledger import holders, reserve
from quota_ledger.model.errors import OverQuota
from quota_ledger.model.requests import ReserveRequest
from quota_ledger.model.values import Blocker, Explanation


class Explanations(EngineBase):
    """The explain call of :class:`QuotaEngine`."""

    if TYPE_CHECKING:
        # from Reservations, which QuotaEngine combines with this class
        def _reserve_request(
            self,
            queue: str,
            resources: Mapping[str, Any],
            *,
            partition: str = DEFAULT_PARTITION,
            user: str | None = None,
            groups: Iterable[str] = (),
            application: str | None = None,
            priority_class: str | None = None,
            ttl: float | timedelta | None = None,
            key: str | None = None,
            terminating: bool = False,
            best_effort: bool | None = None,
            cross_namespace_affinity: bool = False,
        ) -> ReserveRequest: ...

    def explain(
        self,
        queue: str,
        resources: Mapping[str, Any],
        *,
        partition: str = DEFAULT_PARTITION,
        user: str | None = None,
        groups: Iterable[str] = (),
        application: str | None = None,
        priority_class: str | None = None,
        ttl: float | timedelta | None = None,
        key: str | None = None,
        terminating: bool = False,
        best_effort: bool | None = None,
        cross_namespace_affinity: bool = False,
        wait: float | timedelta | None = None,
        block: bool = True,
        priority: int = 0,
    ) -> Explanation:
        """What :meth:`reserve` with the same arguments would decide now, writing nothing.

        The request is decided by the very transaction :meth:`reserve` runs, rolled back at its
        end: ``admitted`` says whether it would be admitted, and a request over a limit gets a
        :class:`Blocker` for each limit that stops it (the :class:`Violation` that
        :class:`OverQuota` would carry, with the largest holders of what that limit counts).
        Any other refusal is raised, as :meth:`reserve` raises it. With ``key``, a key already
        used is explained as :meth:`reserve` would answer it: admitted, if the request is the
        same. With ``wait`` (and ``priority``), a request that would wait gets ``ahead``: how many
        waiting requests of its partition would be tried before it (while requests wait there,
        it would join behind them: not admitted, with no blocker) (``block`` is accepted, as
        :meth:`reserve` accepts it, and changes nothing here).
        """
        seconds, rank = waits.how_to_wait(wait, block, priority)
        request = self._reserve_request(
            queue,
            resources,
            partition=partition,
            user=user,
            groups=groups,
            application=application,
            priority_class=priority_class,
            ttl=ttl,
            key=key,
            terminating=terminating,
            best_effort=best_effort,
            cross_namespace_affinity=cross_namespace_affinity,
        )
        request = dataclasses.replace(request, priority=rank)

        def in_line(tx: LedgerTx, found: Sequence[Blocker]) -> Explanation:
            line = tx.line_ahead(request.partition, request.priority, None)
            needs: dict[str, int] = {}
            for each in line:
                for res, amount in each.needs.items():
                    needs[res] = needs.get(res, 0) + amount
            return Explanation(admitted=False, blockers=tuple(found), ahead=len(line), ahead_needs=needs)

        def work(tx: LedgerTx) -> Explanation:
            behind = seconds is not None and reserve.made_before(tx, request) is None
            if behind and tx.last_queued(request.partition) is not None:
                return in_line(tx, ())  # it would join behind the requests that wait
            undo = Undo(tx)
            undo.before_write()
            try:
                reserve.general(tx, self.rules, self.bounds, request)
            except OverQuota as refused:
                # The holders as the decision saw them, without the request's own rows.
                undo.rollback()
                found = holders.blockers(tx, request.queue, refused.violations)
                return Explanation(admitted=False, blockers=found) if seconds is None else in_line(tx, found)
            return Explanation(admitted=True)

        return self.driver.run(work, rollback=True)
