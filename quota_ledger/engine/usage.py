"""Usage: of queues, and of users, groups and applications in YuniKorn's shapes; the listing of
reservations."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from quota_ledger.config import reports
from quota_ledger.config.rules import PartitionRules
from quota_ledger.engine.base import DEFAULT_PARTITION, EngineBase, T
from quota_ledger.ledger import reads
from quota_ledger.model import listing, validation
from quota_ledger.model.errors import ApplicationNotFound, GroupNotFound, UserNotFound
from quota_ledger.model.tracking import AppState
from quota_ledger.model.values import Reservation, ReservationState, Usage


class UsageReports(EngineBase):
    """The usage calls of :class:`QuotaEngine`."""

    def usage(self, queue: str, *, partition: str = DEFAULT_PARTITION) -> dict[str, Usage]:
        """Usage of ``queue``'s whole subtree per resource, with the queue's own limit."""
        validation.partition(partition)
        validation.queue(queue)
        return self.driver.run(lambda tx: reads.usage(tx, partition, queue), read_only=True)

    def user_usage(self, user: str, *, partition: str = DEFAULT_PARTITION) -> dict[str, Any]:
        """The user's usage tree in YuniKorn's ``UserResourceUsageDAOInfo`` shape."""
        name = validation.name(user, "user")
        report = self._report(
            partition, lambda rules, apps: reports.user_report(rules, name, apps), "user", name
        )
        if report is None:
            raise UserNotFound(name)
        return report

    def group_usage(self, group: str, *, partition: str = DEFAULT_PARTITION) -> dict[str, Any]:
        """The group's usage tree in YuniKorn's ``GroupResourceUsageDAOInfo`` shape."""
        name = validation.name(group, "group")
        report = self._report(
            partition, lambda rules, apps: reports.group_report(rules, name, apps), "group", name
        )
        if report is None:
            raise GroupNotFound(name)
        return report

    def user_usages(self, *, partition: str = DEFAULT_PARTITION) -> list[dict[str, Any]]:
        """Every tracked or configured user's usage tree."""
        return self._report(partition, reads.all_users, None, None)

    def group_usages(self, *, partition: str = DEFAULT_PARTITION) -> list[dict[str, Any]]:
        """Every tracked or configured group's usage tree (``*`` is the shared wildcard bucket)."""
        return self._report(partition, reads.all_groups, None, None)

    def application_summary(self, application: str, *, partition: str = DEFAULT_PARTITION) -> dict[str, Any]:
        """The usage summary of the application's last finished run (also logged on one line
        as ``QUOTA_APP_SUMMARY: {...}``): resource x seconds, with submission, start and finish
        times in epoch milliseconds, user and queue."""
        validation.partition(partition)
        name = validation.name(application, "application")
        found = self.driver.run(lambda tx: tx.latest_summary(partition, name), read_only=True)
        if found is None:
            raise ApplicationNotFound(name)
        return found

    def list_reservations(
        self,
        *,
        partition: str = DEFAULT_PARTITION,
        queue: str | None = None,
        state: str | ReservationState | None = None,
        user: str | None = None,
        application: str | None = None,
        older_than: str | float | timedelta | None = None,
        limit: int = listing.DEFAULT_LIMIT,
    ) -> list[Reservation]:
        """The partition's reservations, oldest first, at most ``limit`` (up to 1000): of
        ``queue`` and every queue below it, in ``state``, of ``user``, of ``application``, made
        longer ago than ``older_than`` (seconds, a timedelta, or ``10m``, ``2h``, ``1d``...),
        each filter only when given. Read from a replica when there are some."""
        wanted = listing.query(
            partition=partition,
            queue=queue,
            state=state,
            user=user,
            application=application,
            older_than=older_than,
            limit=limit,
        )
        return self.driver.run(lambda tx: reads.reservations(tx, wanted), read_only=True)

    def _report(
        self,
        partition: str,
        build: Callable[[PartitionRules, list[AppState]], T],
        kind: str | None,
        name: str | None,
    ) -> T:
        validation.partition(partition)
        return self.driver.run(
            lambda tx: reads.report(tx, self.rules, partition, build, kind, name),
            isolation="REPEATABLE READ",
            read_only=True,
        )
