"""The granter wakes each blocked caller by itself: a grant wakes its own callers only, and a
notice that names a request reads that request's row only."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime

from quota_ledger.driver import line_notices
from quota_ledger.engine.granter import Granter
from quota_ledger.ledger.group_decision import Refused
from quota_ledger.model.values import Reservation, ReservationState


def _reservation(rid: str, state: ReservationState) -> Reservation:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    return Reservation(
        id=rid,
        partition="default",
        queue="root.a",
        resources={"vcore": 1},
        state=state,
        created_at=now,
        expires_at=now,
    )


class _Ledger:
    """What the granter reads: every request waits until :meth:`leave` says otherwise."""

    def __init__(self) -> None:
        self.states: dict[str, ReservationState] = {}
        self.reads: list[list[str]] = []

    def leave(self, rid: str) -> None:
        self.states[rid] = ReservationState.PENDING

    def passes(self, partition: str, reason: str) -> dict[str, Reservation | Refused | None]:
        return {}

    def read(self, ids: Sequence[str]) -> dict[str, Reservation]:
        self.reads.append(sorted(ids))
        return {rid: _reservation(rid, self.states.get(rid, ReservationState.WAITING)) for rid in ids}

    def lines(self, partition: str | None) -> list[str]:
        return []


def _blocked(granter: Granter, rid: str, into: dict[str, Reservation | None]) -> threading.Thread:
    def wait() -> None:
        into[rid] = granter.wait(rid, "default", 30)[0]

    thread = threading.Thread(target=wait)
    thread.start()
    return thread


def _until(condition: object, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.01)


def test_a_notice_naming_a_request_wakes_its_caller_only_and_reads_its_row_only() -> None:
    ledger = _Ledger()
    granter = Granter(ledger.passes, ledger.read, ledger.lines, interval=60)
    woken: dict[str, Reservation | None] = {}
    try:
        threads = {rid: _blocked(granter, rid, woken) for rid in ("r1", "r2", "r3")}
        # the rounds their waits kicked have read all three rows, and nothing else is due
        _until(lambda: bool(ledger.reads) and ledger.reads[-1] == ["r1", "r2", "r3"])
        time.sleep(0.2)
        reads_before = len(ledger.reads)
        ledger.leave("r2")
        granter.heard("default", "r2")
        threads["r2"].join(timeout=10)
        granted = woken["r2"]
        assert granted is not None
        assert granted.state is ReservationState.PENDING
        assert ledger.reads[reads_before:] == [["r2"]]
        time.sleep(0.1)
        assert threads["r1"].is_alive()
        assert threads["r3"].is_alive()
        # a notice of a request no caller here waits for reads nothing
        granter.heard("default", "elsewhere")
        time.sleep(0.1)
        assert ledger.reads[reads_before:] == [["r2"]]
        # one that names no request reads every blocked caller's row
        ledger.leave("r1")
        granter.heard("default")
        threads["r1"].join(timeout=10)
        assert ledger.reads[-1] == ["r1", "r3"]
        assert threads["r3"].is_alive()
    finally:
        granter.close()
    for thread in threads.values():
        thread.join(timeout=10)
    assert woken["r3"] is None  # closing wakes the last caller, with nothing granted


def test_a_notice_payload_names_the_partition_and_the_request_that_left() -> None:
    assert line_notices.parse("default\tabc") == ("default", "abc")
    assert line_notices.parse("default") == ("default", None)


def test_a_notice_of_a_request_this_engine_is_deciding_waits_for_its_decision() -> None:
    ledger = _Ledger()
    granter = Granter(ledger.passes, ledger.read, ledger.lines, interval=60)
    woken: dict[str, Reservation | None] = {}
    try:
        threads = {rid: _blocked(granter, rid, woken) for rid in ("r1", "r2")}
        _until(lambda: bool(ledger.reads) and ledger.reads[-1] == ["r1", "r2"])
        time.sleep(0.2)
        reads_before = len(ledger.reads)
        # r1: this engine grants it, and its notice comes before the grant is handed over
        granter.deciding("r1")
        ledger.leave("r1")
        granter.heard("default", "r1")
        time.sleep(0.1)
        assert threads["r1"].is_alive()  # (held: no read of its row)
        granter.decided("r1", _reservation("r1", ReservationState.PENDING))
        threads["r1"].join(timeout=10)
        assert woken["r1"] is not None
        assert woken["r1"].state is ReservationState.PENDING
        # r2: this engine tried it and did not make it leave; another did: its notice is heard then
        granter.deciding("r2")
        ledger.leave("r2")
        granter.heard("default", "r2")
        time.sleep(0.1)
        assert threads["r2"].is_alive()
        granter.decided("r2", None)
        threads["r2"].join(timeout=10)
        assert woken["r2"] is not None
        assert woken["r2"].state is ReservationState.PENDING
        assert ledger.reads[reads_before:] == [["r2"]]
    finally:
        granter.close()
