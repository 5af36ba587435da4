"""The compiled configuration an engine keeps, so that a transaction compiles it only when a
new version is in force.

Compiling a stored configuration (parse, normalize, build every queue's rules) costs far more
than a reservation, so each engine keeps the newest version it has compiled. A transaction asks
for the version in force under its partition lock and gets the cached copy when the versions
agree. When the versions in between were made by ``set_limits`` (one queue's max each), the
cached copy is moved forward by those changes instead of compiling the whole configuration.
A transaction whose snapshot shows an older version (a lagging replica, or a snapshot taken
before the newest change) gets one of the last few versions kept, or the nearest older one
moved forward.
The PostgreSQL functions take the cached copy without a transaction of their own and check
under the partition lock that its version is still the one in force.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from quota_ledger.config import local_check, model
from quota_ledger.config.local_check import ConfigIndex
from quota_ledger.config.queue_max import LimitChange, grouped
from quota_ledger.config.rules import PartitionRules, Rules, compile_config, with_queue_max
from quota_ledger.driver.tx import LedgerTx

Run = Callable[[Callable[[LedgerTx], Rules]], Rules]

#: how many of the newest versions an engine keeps compiled, for snapshots that lag
KEPT_VERSIONS = 8


def compile_stored(
    version: int, document: Mapping[str, Any], capacity: Mapping[str, Any], kube: Mapping[str, Any]
) -> Rules:
    """Compile a stored (already validated) version."""
    return compile_config(model.normalize(model.load(dict(document))), capacity, version, kube)


def advanced(rules: Rules, changes: list[LimitChange]) -> Rules:
    """``rules`` moved forward by ``changes`` (oldest first)."""
    for version, partition, queue, limits in grouped(changes):
        rules = with_queue_max(rules, version, partition, queue, limits)
    return rules


def advanced_index(index: ConfigIndex, changes: list[LimitChange]) -> ConfigIndex:
    """``index`` moved forward by ``changes`` (oldest first)."""
    for version, partition, queue, limits in grouped(changes):
        index = local_check.advanced(index, version, partition, queue, limits)
    return index


class CompiledRules:
    """The newest configuration this engine compiled; shared by all of its threads."""

    def __init__(self) -> None:
        self._compiled: Rules | None = None
        #: the newest ``KEPT_VERSIONS`` versions compiled, by version
        self._kept: dict[int, Rules] = {}
        #: what set_limits checks a change against, built on first use (see :mod:`local_check`)
        self._index: ConfigIndex | None = None
        self._lock = threading.Lock()
        #: how many times a whole configuration was compiled (moving forward by changes is not)
        self.compiles = 0

    def remember(self, rules: Rules, index: ConfigIndex | None = None) -> None:
        """Keep ``rules`` (and ``index``) if they are newer than what is kept (a configuration
        just applied)."""
        with self._lock:
            current = self._compiled
            if current is None or rules.version > current.version:
                self._compiled = rules
            self._kept[rules.version] = rules
            for version in sorted(self._kept)[:-KEPT_VERSIONS]:
                del self._kept[version]
            if index is not None and (self._index is None or index.version > self._index.version):
                self._index = index

    def in_force(self, tx: LedgerTx, version: int | None = None) -> Rules:
        """The configuration in force, read under the caller's partition lock (or ``version``,
        when the caller read it in ``tx`` with another statement)."""
        version = tx.config_version() if version is None else version
        compiled = self._compiled
        if compiled is not None and compiled.version == version:
            return compiled
        kept = self._kept.get(version)
        if kept is not None:
            return kept
        compiled = self._load(tx, self._older(version), version)
        # A snapshot that lags may show an older version: use it, but keep the newer one.
        self.remember(compiled)
        return compiled

    def _older(self, version: int) -> Rules | None:
        """The newest kept version older than ``version``, to move forward from."""
        with self._lock:
            older = [v for v in self._kept if v < version]
            return self._kept[max(older)] if older else None

    def _load(self, tx: LedgerTx, cached: Rules | None, version: int) -> Rules:
        """Version ``version``: the cached rules moved forward when only changes lie between."""
        if cached is not None and cached.version < version:
            changes = tx.changes_since(cached.version, version)
            if changes is not None:
                return advanced(cached, changes)
        self.compiles += 1
        return compile_stored(version, *tx.load_config(version))

    def indexed(self, tx: LedgerTx, version: int) -> tuple[Rules, ConfigIndex]:
        """The rules and the index of ``version``, which the caller has locked (config head)."""
        rules = self._compiled
        if rules is None or rules.version != version:
            rules = self._load(tx, rules, version)
        index = self._index
        if index is not None and index.version < version:
            changes = tx.changes_since(index.version, version)
            index = None if changes is None else advanced_index(index, changes)
        if index is None or index.version != version:
            index = local_check.build(version, tx.load_config(version)[0])
        self.remember(rules, index)
        return rules, index

    def partition(self, tx: LedgerTx, partition: str, version: int | None = None) -> PartitionRules:
        """One partition's rules in force (see :meth:`in_force`)."""
        return self.in_force(tx, version).partition(partition)

    def of(self, partition: str) -> Callable[[LedgerTx], PartitionRules]:
        """A step that reads ``partition``'s rules in force inside a transaction."""
        return lambda tx: self.partition(tx, partition)

    def known(self, run: Run) -> Rules:
        """The newest configuration compiled so far; compiled in a transaction of ``run`` on
        first use. May be out of date: the PostgreSQL functions check its version."""
        return self._compiled or run(self.in_force)
