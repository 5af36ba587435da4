"""Differential test: PostgreSQL's ``quota_ledger_release`` and ``quota_ledger_grant`` against
the rule's paths they stand in for, as ``test_differential`` holds the set functions to them.

``quota_ledger_release`` rolls back a pending plain reservation, or releases a committed one,
in one call: after any state the strategies make, a list of rollbacks and releases, each by
the function (the rule's path deciding what it declines, as the engine runs them) and each by
the rule's path alone, must hand back the same reservations (or raise the same errors) and
leave the same rows. ``quota_ledger_grant`` grants one waiting request by
``quota_ledger_reserve_many``: a request put in line after any state must be granted by the
function exactly when the rule grants it, with the same reservation, the same answer to
"would the same request fit again", and the same rows; a request it finds over a limit the rule
refuses too, and it writes nothing then. Each example runs in a transaction that is rolled back,
each side in a savepoint rolled back after its rows are read.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from test_differential import (
    _SETTINGS,
    PARTITION,
    Ask,
    State,
    _event,
    asks,
    ledger,
    prepare,
    snapshot,
    states,
    timeless,
)

from quota_ledger import QuotaEngine
from quota_ledger.driver import sql
from quota_ledger.driver.tx import LedgerTx
from quota_ledger.ledger import release, release_function, resolve, waiting
from quota_ledger.ledger.compiled import CompiledRules
from quota_ledger.ledger.group_decision import Refused
from quota_ledger.model import validation
from quota_ledger.model.errors import QuotaLedgerError
from quota_ledger.model.values import Reservation

__all__ = ["ledger"]  # (the fixture, shared with test_differential)

Outcome = Reservation | type[QuotaLedgerError]


def _free(tx: LedgerTx, rules: CompiledRules, rid: str, place: int, rollback: bool, alone: bool) -> Outcome:
    """A rollback or a release of ``rid``: as the engine runs it (the function first), or by the
    rule's path ``alone``; the reservation (its times at the epoch) or the error's type."""
    operation = f"op-{place}"
    try:
        if rollback:
            done = (resolve if alone else release_function).rollback(tx, rules, rid)
        else:
            done = (release if alone else release_function).release_reservation(
                tx, rules, rid, False, operation
            )
    except QuotaLedgerError as error:
        return type(error)
    return timeless(done)


def check_frees(
    tx: LedgerTx, bounds: validation.Bounds, state: State, picks: Sequence[tuple[int, bool]]
) -> None:
    """Roll back or release the reservations ``picks`` names among those ``state`` made (by
    index, repeats included) as the engine does and by the rule alone: the same outcomes and
    the same rows."""
    rules, made = prepare(tx, bounds, state)
    assume(made)
    plan = [(made[p % len(made)].id, rollback) for p, rollback in picks]
    before = snapshot(tx)
    savepoint = tx.conn.begin_nested()
    by_function = [
        _free(tx, rules, rid, place, rollback, alone=False) for place, (rid, rollback) in enumerate(plan)
    ]
    function_rows = snapshot(tx)
    savepoint.rollback()
    assert snapshot(tx) == before
    savepoint = tx.conn.begin_nested()
    by_rule = [
        _free(tx, rules, rid, place, rollback, alone=True) for place, (rid, rollback) in enumerate(plan)
    ]
    rule_rows = snapshot(tx)
    savepoint.rollback()
    plain = {r.id for r in made if r.user is None and r.application is None}
    _event("a plain one among them" if any(rid in plain for rid, _ in plan) else "none plain")
    assert by_function == by_rule, "the outcomes differ"
    assert function_rows == rule_rows, "the rows differ"


def check_grant(tx: LedgerTx, bounds: validation.Bounds, state: State, ask: Ask) -> None:
    """Put ``ask`` in line after ``state``, then grant it by the function and by the rule."""
    rules, _ = prepare(tx, bounds, state)
    joined = waiting.join(tx, rules, ask.request(), 3600, [])
    (each,) = [w for w in tx.line_rows(PARTITION, 100) if w.id == joined.id]
    before = snapshot(tx)
    savepoint = tx.conn.begin_nested()
    by_function = waiting.function_grant(tx, rules.known(lambda read: read(tx)), waiting.line_request(each))
    function_rows = snapshot(tx)
    savepoint.rollback()
    assert snapshot(tx) == before
    savepoint = tx.conn.begin_nested()
    by_rule = waiting.grant(tx, rules, bounds, joined.id)
    rule_rows = snapshot(tx)
    savepoint.rollback()
    assert not isinstance(by_function, waiting.Left), "it waits"
    if by_function is None:
        _event("declined: the rule decides")
        assert function_rows == before, "a declined grant wrote"
        return
    if isinstance(by_function, waiting.Over):
        _event("over a limit")
        assert isinstance(by_rule, Refused), "the function found a limit the rule does not"
        assert function_rows == before, "a refused grant wrote"
        return
    _event("granted")
    assert isinstance(by_rule, waiting.Granted), "the function granted what the rule refuses"
    assert timeless(by_function.reservation) == timeless(by_rule.reservation), "the reservations differ"
    assert by_function.full == by_rule.full, "they disagree on whether the same again would fit"
    assert function_rows == rule_rows, "the rows differ"


@_SETTINGS
@given(
    state=states(min_held=1),
    picks=st.lists(st.tuples(st.integers(0, 7), st.booleans()), min_size=1, max_size=6),
)
def test_release_function_decides_as_the_rule(
    ledger: QuotaEngine, state: State, picks: list[tuple[int, bool]]
) -> None:
    ledger.driver.run(lambda tx: check_frees(tx, ledger.bounds, state, picks), rollback=True)


@_SETTINGS
@given(state=states(), ask=asks())
def test_grant_function_decides_as_the_rule(ledger: QuotaEngine, state: State, ask: Ask) -> None:
    ledger.driver.run(lambda tx: check_grant(tx, ledger.bounds, state, ask), rollback=True)


# -- the tests have teeth --------------------------------------------------------------------------
#: root.a, under a root with room for 5 fpga
_ROOM_FOR_FIVE = State(
    document={"partitions": [{"name": PARTITION, "queues": [{"name": "root", "queues": [{"name": "a"}]}]}]},
    capacity={PARTITION: {"fpga": 5}},
)


def test_a_release_function_that_gives_back_too_little_is_caught(ledger: QuotaEngine) -> None:
    # A copy of the function that gives back one unit less, installed in a transaction that is
    # rolled back, must fail the check; the function as it is must pass it.
    definition = sql.definition("release")
    give_back = "SET reserved = u.reserved - d.amount"
    assert definition.count(give_back) == 1, "the mutation below no longer applies"
    mutated = definition.replace(give_back, give_back + " + 1")
    state = State(_ROOM_FOR_FIVE.document, _ROOM_FOR_FIVE.capacity, ((Ask("root.a", {"fpga": 2}), False),))

    def check(tx: LedgerTx) -> None:
        check_frees(tx, ledger.bounds, state, [(0, True)])
        tx.conn.exec_driver_sql(mutated)
        with pytest.raises(AssertionError, match="the rows differ"):
            check_frees(tx, ledger.bounds, state, [(0, True)])

    ledger.driver.run(check, rollback=True)


def test_a_grant_function_wrong_on_room_again_is_caught(ledger: QuotaEngine) -> None:
    # 2 asked of 4: granted, and the same again would fit, exactly at the limit. A copy of the
    # limit check that takes a counter at its limit for one over says it would not.
    definition = sql.definition("over")
    limit_test = "u.in_use::numeric + u.reserved + i.amount > u.hard_limit"
    assert definition.count(limit_test) == 1, "the mutation below no longer applies"
    mutated = definition.replace(limit_test, limit_test.replace("> u.hard_limit", ">= u.hard_limit"))
    state = State(_ROOM_FOR_FIVE.document, {PARTITION: {"fpga": 4}})
    ask = Ask("root.a", {"fpga": 2})

    def check(tx: LedgerTx) -> None:
        check_grant(tx, ledger.bounds, state, ask)
        tx.conn.exec_driver_sql(mutated)
        with pytest.raises(AssertionError, match="whether the same again would fit"):
            check_grant(tx, ledger.bounds, state, ask)

    ledger.driver.run(check, rollback=True)
