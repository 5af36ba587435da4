"""Which decider decides each operation: chosen here, and nowhere else.

The rule (:mod:`quota_ledger.model.charges`) decides on every backend: an operation's step
(``reserve.general``, ``resolve.commit_general``, ...) locks its counters and asks the rule.
Two things may decide instead, for speed, and both decide as the rule would:

- on PostgreSQL, where the ledger's functions are installed (``DbQuotaDriver.functions``, off
  for a schema before them), a server function: one call for a request alone, and with
  batching one call for a batch's reserves of a partition and one for its whole commits
  (:mod:`quota_ledger.driver.pg_functions`; what each declines is listed in its source's
  header, and the step then decides);
  A partition with a ``StrictFIFO`` queue is left to the rule, which reads its waiting lines;
  a rollback or a release of a plain reservation is one call too (:mod:`.release_function`,
  in the freeing transaction), and so is a waiting request's grant, in a pass
  (:func:`.waiting.grant_by_function`) and in a freeing transaction (:func:`.waiting.grant_head`,
  which calls it where the database has it);
- with batching on MariaDB and SQLite, a set: a batch's keyless reserves of a partition
  (:func:`.reserve.decide`, which decides a request alone as a set of one), and its commits,
  whole or partial (:func:`.resolve.together`: the function that resolves a commit alone, for
  all of them), decided by the rule together.

:class:`Paths` is built once per engine from the driver and the batching setting and hands each
operation its group-commit request (:class:`.group_commit.Deciders`): the step, and the function
call or set that may decide it first.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial

from quota_ledger.driver.core import DbQuotaDriver
from quota_ledger.driver.tx import LedgerTx
from quota_ledger.driver.waiting_line import Waiting
from quota_ledger.ledger import (
    commit_function,
    group_commit,
    release,
    release_function,
    reserve,
    reserve_function,
    resolve,
    waiting,
)
from quota_ledger.ledger.compiled import CompiledRules
from quota_ledger.ledger.group_decision import Refused
from quota_ledger.model import validation
from quota_ledger.model.requests import ReserveRequest
from quota_ledger.model.values import Reservation


class Paths:
    """The deciders of one engine's operations."""

    def __init__(
        self,
        driver: DbQuotaDriver,
        rules: CompiledRules,
        bounds: validation.Bounds,
        batching: group_commit.GroupCommit | None,
    ) -> None:
        self.driver = driver
        self.rules = rules
        self.bounds = bounds
        self.batching = batching

    @property
    def functions(self) -> bool:
        """Whether a server function may decide a request alone, or expire a batch of plain
        reservations (PostgreSQL, installed)."""
        return self.driver.functions

    @property
    def batch_functions(self) -> bool:
        """Whether a batch may be decided by server function calls (asked once)."""
        return self.batching is not None and self.batching.functions

    @property
    def sets(self) -> bool:
        """Whether a batch may decide requests as sets of the rule (batching, not PostgreSQL)."""
        return self.batching is not None and self.driver.backend != "postgresql"

    def reserve(self, request: ReserveRequest) -> group_commit.Deciders[Reservation]:
        step = partial(reserve.general, rules=self.rules, bounds=self.bounds, request=request)
        batch_call = partial(reserve_function.in_batch, rules=self.rules, request=request)
        alone = None
        # The server functions know nothing of waiting lines: a partition with a StrictFIFO
        # queue is decided by the rule, which reads its lines (a configuration made strict
        # since these rules were compiled changes the version, which the functions decline).
        functions = not self.rules.known(self.driver.run).partition(request.partition).has_strict_lines
        if functions and self.functions and request.resources:
            by_function = reserve_function.by_function_or_general
            alone = partial(by_function, self.driver, self.rules, self.bounds, request)
        return group_commit.Deciders(
            step,
            (request.partition, request.queue),
            batch_call if functions and self.batch_functions else None,
            alone,
            reserve.together(self.rules, self.bounds, request) if self.sets else None,
        )

    def commit(
        self, reservation_id: str, amounts: Mapping[str, int] | None, operation_id: str
    ) -> group_commit.Deciders[resolve.CommitOutcome]:
        step = partial(
            resolve.commit_general,
            rules=self.rules,
            reservation_id=reservation_id,
            amounts=amounts,
            operation_id=operation_id,
        )
        whole = amounts is None
        batch_call = partial(
            commit_function.in_batch, reservation_id=reservation_id, operation_id=operation_id
        )
        alone = None
        if whole and self.functions:
            alone = partial(
                commit_function.by_function_or_general, self.driver, self.rules, reservation_id, operation_id
            )
        return group_commit.Deciders(
            step,
            by_function=batch_call if whole and self.batch_functions else None,
            alone=alone,
            together=resolve.together(self.rules, reservation_id, amounts, operation_id)
            if self.sets
            else None,
        )

    def rollback(self, reservation_id: str) -> group_commit.Deciders[Reservation]:
        module = release_function if self.functions else resolve
        return group_commit.Deciders(
            partial(module.rollback, rules=self.rules, reservation_id=reservation_id)
        )

    def release_reservation(
        self, reservation_id: str, finished: bool, operation_id: str
    ) -> group_commit.Deciders[Reservation]:
        module = release_function if self.functions else release
        step = partial(
            module.release_reservation,
            rules=self.rules,
            reservation_id=reservation_id,
            finished=finished,
            operation_id=operation_id,
        )
        return group_commit.Deciders(step)

    def grant(self, each: Waiting) -> waiting.Granted | waiting.Over | Reservation | Refused | None:
        """Decide the waiting request ``each`` (as a pass read it) again: by the server function
        where it decides, else by the rule's path (:func:`.waiting.grant`) in a transaction of
        its own. None: there is no such request, or (the function) it no longer waits;
        :data:`.waiting.OVER`: (the function) it is over a limit, refused as the rule refuses."""
        if self.functions:
            granted = waiting.grant_by_function(self.driver, self.rules, each)
            if isinstance(granted, waiting.Left):
                return None  # (decided elsewhere: its callers hear of it from there)
            if granted is not None:
                return granted

        def step(tx: LedgerTx) -> waiting.Granted | Reservation | Refused | None:
            return waiting.grant(tx, self.rules, self.bounds, each.id)

        return self.driver.run(step)
