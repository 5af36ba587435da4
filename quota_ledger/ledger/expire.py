"""Expiry: the sweep that resolves pending reservations whose time ran out.

Partition by partition, in batches of one short transaction each (:mod:`.batches` runs them,
on one or several threads, paced). On PostgreSQL the plain reservations of a partition (those
no ResourceQuota counts) go first, a whole batch per call of the server function
``ledger_expire`` (migration 0004); the general batches then sweep everything else, and on
the other engines everything.

No reservation stops the sweep of the others. A general batch that fails (but for an outage,
which every batch would meet) is bisected, each half its own transaction, until what fails is
one reservation: that one is set aside (:class:`.batches.SetAside`) and skipped from then on,
and the rest expire. While a partition has a reservation set aside its sweep takes the general
path only, as the server function cannot be told to skip it; a call of the function that fails
hands the partition to the general batches, which find the reservation.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from datetime import UTC, datetime
from functools import partial

from quota_ledger.driver import pg_functions
from quota_ledger.driver.core import DbQuotaDriver
from quota_ledger.driver.tx import LedgerTx
from quota_ledger.ledger import batches, resolve
from quota_ledger.ledger.compiled import CompiledRules
from quota_ledger.model.errors import DatabaseUnavailable, SchemaNotReady
from quota_ledger.model.values import Reservation, ReservationState, StoredReservation

log = logging.getLogger("quota_ledger.sweeper")

#: errors that say nothing of the rows a batch holds: any batch would meet them, none is bisected
OUTAGES = (DatabaseUnavailable, SchemaNotReady)


def sweep(
    driver: DbQuotaDriver,
    rules: CompiledRules,
    *,
    batch_size: int,
    budget: batches.Budget,
    workers: int,
    pacer: batches.Pacer,
    set_aside: batches.SetAside,
    by_function: bool,
) -> int:
    """Expire what has run out in every partition, but what ``set_aside`` holds; how many.
    ``by_function``: plain reservations first by ``ledger_expire`` (see :mod:`.paths`)."""
    total = 0
    for partition in driver.partitions():
        if by_function and not set_aside.ids(partition):
            fast = partial(function_batch_or_none, driver, rules, partition, batch_size)
            total += batches.run(fast, batch_size, budget, workers, pacer)
        general = partial(bisected_batch, driver, rules, partition, batch_size, set_aside)
        total += batches.run(general, batch_size, budget, workers, pacer, set_aside)
    return total


def function_batch_or_none(
    driver: DbQuotaDriver, rules: CompiledRules, partition: str, batch_size: int
) -> int:
    """:func:`function_batch`; one that fails (but for an outage) expires nothing, and the
    general batches that follow sweep the partition."""
    try:
        return function_batch(driver, rules, partition, batch_size)
    except OUTAGES:
        raise
    except Exception as error:  # whatever a row caused, the general batches bisect it
        log.warning(
            "ledger_expire failed in partition %r (%s): the general batches sweep it", partition, error
        )
        return 0


def function_batch(driver: DbQuotaDriver, rules: CompiledRules, partition: str, batch_size: int) -> int:
    """Expire up to ``batch_size`` plain reservations in one call of ``ledger_expire``; how many.

    The call declines when the configuration changed since the one it is given was compiled
    (which quotas count what depends on it): the new one is compiled and the call made again.
    """
    for _attempt in range(3):
        known = rules.known(driver.run)
        skip = sorted(known.partition(partition).quotas)
        rows = driver.call(
            pg_functions.EXPIRE, pg_functions.expire_params(partition, batch_size, skip, known.version)
        )
        if rows is not None:
            return int(rows[0][0])
        if not driver.functions:
            return 0  # no functions in this database: the general batches sweep everything
        driver.run(rules.in_force)  # the configuration changed: compile the new one
    return 0  # it keeps changing: the general path sweeps what is left


def bisected_batch(
    driver: DbQuotaDriver, rules: CompiledRules, partition: str, batch_size: int, set_aside: batches.SetAside
) -> int:
    """One general batch of up to ``batch_size`` reservations, skipping those set aside; how
    many expired. If it fails, the reservations it held are read again and bisected."""
    skip = set_aside.ids(partition)
    try:
        return driver.run(
            partial(general_batch, rules=rules, partition=partition, batch_size=batch_size, skip=skip)
        )
    except OUTAGES:
        raise
    except Exception as error:  # bisected: one reservation's failure stays its own
        failed = error
    held = driver.run(partial(expired_ids, partition=partition, batch_size=batch_size, skip=skip))
    log.warning(
        "an expiry batch of %d in partition %r failed (%s): bisecting it", len(held), partition, failed
    )
    return _bisect(driver, rules, partition, held, failed, set_aside)


def _bisect(
    driver: DbQuotaDriver,
    rules: CompiledRules,
    partition: str,
    ids: Sequence[str],
    error: Exception,
    set_aside: batches.SetAside,
) -> int:
    """Expire ``ids``, whose batch failed with ``error``, half by half; set aside a reservation
    that fails alone. How many expired."""
    if len(ids) == 1:
        set_aside.add(partition, ids[0], error)
        return 0
    total = 0
    middle = len(ids) // 2
    for half in (ids[:middle], ids[middle:]):
        if not half:
            continue
        try:
            total += driver.run(partial(listed_batch, rules=rules, partition=partition, ids=half))
        except OUTAGES:
            raise
        except Exception as failed:  # bisected further
            total += _bisect(driver, rules, partition, half, failed, set_aside)
    return total


def general_batch(
    tx: LedgerTx, rules: CompiledRules, partition: str, batch_size: int, skip: Collection[str] = ()
) -> int:
    """Expire up to ``batch_size`` pending reservations of a partition in one transaction,
    skipping rows another sweeper or a concurrent commit holds, and those of ``skip``; how many."""
    now = tx.db_now()
    return expire_locked(tx, rules, _unskipped(tx, partition, batch_size, skip, now), now)


def expired_ids(tx: LedgerTx, partition: str, batch_size: int, skip: Collection[str]) -> list[str]:
    """The ids :func:`general_batch` would expire now (locked, and let go unchanged)."""
    return [s.reservation.id for s in _unskipped(tx, partition, batch_size, skip, tx.db_now())]


def listed_batch(tx: LedgerTx, rules: CompiledRules, partition: str, ids: Sequence[str]) -> int:
    """Expire those of ``ids`` that are still pending and have run out, in one transaction;
    how many."""
    stored, now = tx.lock_reservations(ids)
    if now is None:
        return 0
    due = now.replace(tzinfo=UTC)
    expiring = [
        s
        for s in stored
        if s.reservation.state is ReservationState.PENDING
        and s.reservation.partition == partition
        and s.reservation.expires_at <= due
    ]
    return expire_locked(tx, rules, expiring, now)


def _unskipped(
    tx: LedgerTx, partition: str, batch_size: int, skip: Collection[str], now: datetime
) -> list[StoredReservation]:
    """Lock up to ``batch_size`` expired reservations not in ``skip``. Those set aside ran out
    first, so they are among the first found: the batch asks for as many more."""
    stored = tx.lock_expired(partition, batch_size + len(skip), now)
    return [s for s in stored if s.reservation.id not in skip][:batch_size]


def expire_locked(
    tx: LedgerTx, rules: CompiledRules, stored: Sequence[StoredReservation], now: datetime
) -> int:
    """Expire pending reservations this transaction has locked, as one set; how many."""
    expiring = [resolve.Resolution(each, ReservationState.EXPIRED) for each in stored]
    return sum(isinstance(done, Reservation) for done in resolve.resolve(tx, rules, expiring, now))
