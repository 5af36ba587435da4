"""The compiled configuration an engine keeps, so that a transaction compiles it only when a
new version is in force.

Compiling a stored configuration (parse, normalize, build every queue's rules) costs far more
than a reservation, so each engine keeps the newest version it has compiled. A transaction asks
for the version in force under its partition lock and gets the cached copy when the versions
agree. The PostgreSQL functions take the cached copy without a transaction of their own and
check under the partition lock that its version is still the one in force.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from quota_ledger.config import model
from quota_ledger.config.rules import PartitionRules, Rules, compile_config
from quota_ledger.driver.tx import LedgerTx

Run = Callable[[Callable[[LedgerTx], Rules]], Rules]


def compile_stored(
    version: int, document: Mapping[str, Any], capacity: Mapping[str, Any], kube: Mapping[str, Any]
) -> Rules:
    """Compile a stored (already validated) version."""
    return compile_config(model.normalize(model.load(dict(document))), capacity, version, kube)


class CompiledRules:
    """The newest configuration this engine compiled; shared by all of its threads."""

    def __init__(self) -> None:
        self._compiled: Rules | None = None
        self._lock = threading.Lock()

    def remember(self, rules: Rules) -> None:
        """Keep ``rules`` if they are newer than what is kept (a configuration just applied)."""
        with self._lock:
            current = self._compiled
            if current is None or rules.version > current.version:
                self._compiled = rules

    def in_force(self, tx: LedgerTx) -> Rules:
        """The configuration in force, read under the caller's partition lock."""
        version = tx.config_version()
        compiled = self._compiled
        if compiled is None or compiled.version != version:
            compiled = compile_stored(version, *tx.load_config(version))
            # A replica that lags may show an older version: use it, but keep the newer one.
            self.remember(compiled)
        return compiled

    def partition(self, tx: LedgerTx, partition: str) -> PartitionRules:
        """One partition's rules in force (see :meth:`in_force`)."""
        return self.in_force(tx).partition(partition)

    def of(self, partition: str) -> Callable[[LedgerTx], PartitionRules]:
        """A step that reads ``partition``'s rules in force inside a transaction."""
        return lambda tx: self.partition(tx, partition)

    def known(self, run: Run) -> Rules:
        """The newest configuration compiled so far; compiled in a transaction of ``run`` on
        first use. May be out of date: the PostgreSQL functions check its version."""
        return self._compiled or run(self.in_force)
