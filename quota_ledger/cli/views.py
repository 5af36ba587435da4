"""The CLI's work that reads the same on a database (``--db``) and through a service
(``--url``): the queue tree, short reservation ids, and the long runs that draw a progress bar
on a terminal (``sweep --once``, ``audit``)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from quota_ledger.cli import progress
from quota_ledger.model import short_ids

if TYPE_CHECKING:
    from typing_extensions import TypeIs

    from quota_ledger.cli.remote import RemoteEngine
    from quota_ledger.engine import QuotaEngine
    from quota_ledger.ledger.batches import SetAside
    from quota_ledger.model.values import Drift, Usage

# The engine's modules (quota_ledger.runtime.overview among them) and the service client are
# imported by the functions that use them: the command modules import this one, and building the
# parser must stay cheap.


def _remote(engine: QuotaEngine | RemoteEngine) -> TypeIs[RemoteEngine]:
    """Whether ``engine`` is the service's client; a command on a database (``--db``) never
    loads the client's module (HTTP, YAML) to find out."""
    client = sys.modules.get("quota_ledger.cli.remote")
    return client is not None and isinstance(engine, client.RemoteEngine)


def full_id(engine: QuotaEngine | RemoteEngine, text: str) -> str:
    """The full reservation id a unique prefix stands for (see :mod:`quota_ledger.model.short_ids`)."""
    from quota_ledger.runtime import overview

    if _remote(engine):
        return short_ids.resolve(text, engine.reservation_ids)
    return short_ids.resolve(text, lambda prefix, n: overview.reservation_ids(engine, prefix, n))


def queue_tree(engine: QuotaEngine | RemoteEngine, partition: str) -> dict[str, dict[str, Usage]]:
    """Every queue with usage or a limit: its subtree's usage and its own limit."""
    from quota_ledger.runtime import overview

    if _remote(engine):
        return engine.queue_tree(partition)
    return overview.queue_tree(engine, partition)


def expire_backlog(
    engine: QuotaEngine, batch: int, workers: int, rate: float | None, set_aside: SetAside
) -> int:
    """One sweep of everything that ran out: a single ``expire()`` call for a script; on a
    terminal, rounds of one batch per worker so that the bar moves, then a last call that
    sweeps to the end what ran out meanwhile, as the single call would. What cannot be expired
    is left in ``set_aside``, once for every call."""
    from quota_ledger.runtime import overview

    if not progress.wanted():
        return engine.expire(batch_size=batch, workers=workers, max_rate=rate, set_aside=set_aside)
    total = 0
    with progress.bar("expiring reservations", overview.expired_backlog(engine)) as meter:
        while True:
            expired = engine.expire(
                batch_size=batch, workers=workers, max_rate=rate, max_batches=workers, set_aside=set_aside
            )
            total += expired
            meter.advance(expired)
            if expired < workers * batch:
                break
        expired = engine.expire(batch_size=batch, workers=workers, max_rate=rate, set_aside=set_aside)
        meter.advance(expired)
    return total + expired


def audit(engine: QuotaEngine | RemoteEngine, *, fix: bool, partition: str | None) -> list[Drift]:
    """``audit()`` a partition at a time (each is its own transaction anyway), with a bar."""
    if _remote(engine) or partition is not None:
        with progress.bar(f"auditing {partition or 'every partition'}", None):
            return engine.audit(fix=fix, partition=partition)
    names = engine.driver.partitions()
    drifts: list[Drift] = []
    with progress.bar("auditing", len(names)) as meter:
        for name in names:
            meter.describe(f"auditing partition {name}")
            drifts += engine.audit(fix=fix, partition=name)
            meter.advance()
    return drifts
