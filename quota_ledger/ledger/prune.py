"""Prune: remove the counters at zero that nothing references (:mod:`quota_ledger.config.references`).

One transaction for every partition asked for, all or nothing. A dry run reads one snapshot; an
applying run takes each partition's lock exclusively, in name order as a configuration change
does, so no reservation runs there meanwhile (a reservation is what creates counters and first
uses), then locks the candidates and deletes those still at zero. A counter a concurrent commit,
release or expiry holds (they take no partition lock) is waited for, and kept if it changed.
"""

from __future__ import annotations

from collections.abc import Sequence

from quota_ledger.config import references
from quota_ledger.driver.tx import LedgerTx
from quota_ledger.ledger.compiled import CompiledRules
from quota_ledger.model.counters import QUEUE
from quota_ledger.model.values import IdleCounter


def prune(tx: LedgerTx, rules: CompiledRules, partitions: Sequence[str], apply: bool) -> list[IdleCounter]:
    """The idle counters of ``partitions``, deleted when ``apply``."""
    names = sorted(set(partitions))
    if apply:
        for name in names:
            tx.lock_partition(name, exclusive=True)
    found: list[IdleCounter] = []
    queue_ids: list[int] = []
    identity_ids: list[int] = []
    for name in names:
        in_force = rules.partition(tx, name)
        users, groups = tx.live_identities(name)
        live = references.Live(pending=tx.pending_pairs(name), users=users, groups=groups)
        for row_id, counter in tx.zero_counters(name, lock=apply):
            if references.idle(in_force, counter, live):
                found.append(counter)
                (queue_ids if counter.kind == QUEUE else identity_ids).append(row_id)
    if apply:
        gone = tx.delete_idle(queue_ids, identity_ids)
        # Under the locks taken above nothing can have moved them; a mismatch is a bug, and the
        # whole prune is undone rather than reported wrongly.
        if gone != len(found):
            raise RuntimeError(f"prune deleted {gone} counters of the {len(found)} it locked at zero")
    return found
