"""Limits and the YuniKorn configuration: set, apply, compare, check and read them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from quota_ledger.config.diff import ConfigDiff
from quota_ledger.engine.base import DEFAULT_PARTITION, EngineBase
from quota_ledger.ledger import configure, reads, set_limits
from quota_ledger.model import arguments, validation
from quota_ledger.model.errors import InvalidRequest
from quota_ledger.model.quantity import APPLICATIONS, parse_limits
from quota_ledger.model.values import ConfigProblem, LimitsVersion


class Configuration(EngineBase):
    """The limit and configuration calls of :class:`QuotaEngine`."""

    def set_limits(
        self, queue: str, resources: Mapping[str, Any], *, partition: str = DEFAULT_PARTITION
    ) -> LimitsVersion:
        """Set the named resources' limits on ``queue``'s subtree; None removes a limit.

        Resources not named keep their limits. This edits the queue's ``resources.max`` in the
        configuration as a new version, refused exactly when :meth:`apply_config` would refuse
        the edited configuration; root's limits are the partition's capacity, kept next to it.
        On a configured queue it checks and changes only that queue (its path and subtree), so
        its cost does not grow with the configuration. A queue not configured yet is added the
        same way (with the levels missing above it) in a configured partition without placement
        rules; otherwise through a whole new version. Lowering a limit below current usage is
        allowed: nothing is evicted, new reservations are refused until usage drops. Returns the
        new configuration version (the one in force when nothing changes), an ``int`` whose
        ``warnings`` name what looks like a typo of a known name: a resource no limit names yet
        close to one that is, a new queue outside every configured one close to a configured
        sibling. A partition with ``unknownnames: refuse`` raises :class:`UnknownResource` or
        :class:`UnknownQueue` for those instead, and nothing changes.
        """
        validation.partition(partition)
        validation.queue(queue)
        if isinstance(resources, Mapping):
            self.bounds.limit_set(resources)
        wanted = parse_limits(resources)
        if APPLICATIONS in wanted:
            raise InvalidRequest("set maxapplications in the configuration", field=APPLICATIONS)
        version = self.driver.run(
            lambda tx: set_limits.set_limits(tx, self.rules, partition, queue, wanted, self.bounds)
        )
        self._freed(partition, "limits")
        return version

    def apply_config(self, source: Any, *, allow_removing_all: bool = False) -> int:
        """Apply a YuniKorn queue configuration (YAML text, a dict or a path) to every partition.

        All or nothing, in one transaction: on any problem raises :class:`ConfigError` listing
        all of them and changes nothing. Reservations keep flowing and see either the old or
        the new limits. Returns the new version; a configuration identical to the one in force
        changes nothing and returns the current version. A configuration that would leave a
        partition that has limits without any (``partitions: []``, say) raises
        :class:`RemovesAllLimits` unless ``allow_removing_all=True``. What :meth:`config`
        returns, or ``{"version": n, "config": {...}}`` as the service serves it, is accepted.
        """
        source = arguments.read_path(source)
        allow = validation.flag(allow_removing_all, "allow_removing_all")
        edit = configure.replace_with(source)
        version = self.driver.run(lambda tx: self._apply(tx, edit, allow_removing_all=allow))
        self._freed(None, "configuration")
        return version

    def edit_config(self, edit: Callable[[dict[str, Any]], Any], *, allow_removing_all: bool = False) -> int:
        """Apply ``edit(document)`` to the configuration in force, as :meth:`apply_config` would
        apply what it returns, in one transaction under the configuration's lock.

        ``edit`` gets a copy of the document in force (the form :meth:`config` returns) and
        returns the new one (it may change and return its argument). Two processes editing at
        once never lose each other's change, as a :meth:`config` read followed by an
        :meth:`apply_config` could. ``edit`` may run again if the transaction is retried, so it
        should do nothing else. Returns the new version (the one in force when nothing changes).
        """
        allow = validation.flag(allow_removing_all, "allow_removing_all")

        def step(document: dict[str, Any], capacity: dict[str, dict[str, int]]) -> tuple[Any, Any]:
            return configure.unwrap(edit(document)), capacity

        version = self.driver.run(lambda tx: self._apply(tx, step, allow_removing_all=allow))
        self._freed(None, "configuration")
        return version

    def diff_config(self, source: Any) -> ConfigDiff:
        """What :meth:`apply_config` would do with ``source`` now, changing nothing: the limits
        added, removed and changed, and every queue, user and group whose current usage would
        then be over its limit. Raises :class:`ConfigError` as applying it would."""
        source = arguments.read_path(source)
        return self.driver.run(
            lambda tx: configure.diff(tx, source, self.bounds), isolation="REPEATABLE READ"
        )

    def validate_config(self, source: Any) -> list[ConfigProblem]:
        """Every problem of a configuration; changes nothing (empty list: it would apply).

        Read against the configuration in force, as :meth:`apply_config` would: an empty
        document is a problem when it would remove the limits in force."""
        source = arguments.read_path(source)
        return self.driver.run(lambda tx: configure.check_in_force(tx, source, self.bounds), read_only=True)

    def config(self) -> dict[str, Any]:
        """The configuration in force, normalized (a dict :meth:`apply_config` accepts)."""
        return self.driver.run(lambda tx: tx.load_config(tx.config_version())[0])

    def config_version(self) -> int:
        """The version of the configuration in force (0: nothing applied yet)."""
        return self.driver.run(lambda tx: tx.config_version())

    def limits(self, *, partition: str = DEFAULT_PARTITION) -> dict[str, dict[str, int]]:
        """Every limit in the partition: ``{queue: {resource: limit}}``."""
        validation.partition(partition)
        return self.driver.run(lambda tx: reads.limits(tx, partition), read_only=True)
