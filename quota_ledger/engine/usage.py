"""Usage: of queues, and of users, groups and applications in YuniKorn's shapes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from quota_ledger.config import reports
from quota_ledger.config.rules import PartitionRules
from quota_ledger.engine.base import DEFAULT_PARTITION, EngineBase, T
from quota_ledger.ledger import reads
from quota_ledger.model import validation
from quota_ledger.model.errors import ApplicationNotFound, GroupNotFound, UserNotFound
from quota_ledger.model.tracking import AppState
from quota_ledger.model.values import Usage


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
