"""The waiting line against a pure-Python model of limits plus lines, on every decision path:
random reserves (at once or waiting, with priorities), rollbacks and cancellations, partial
commits, releases, waits that run out and limit changes, under ``StrictFIFO`` and
``BestEffortFIFO``. After every step each reservation's state, each waiting request's place
and the counters agree with the model, which grants in the policy's order and never lets a
request wait while it fits and nothing ahead of it in a strict line it shares waits."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from datetime import datetime

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test
from sqlalchemy import text

from quota_ledger import OverQuota, QuotaEngine, ReservationState

TEAM, A, B = "root.team", "root.team.a", "root.team.b"
COUNTER = itertools.count()


@dataclass
class Request:
    id: str
    queue: str
    amount: int
    priority: int
    seq: int
    state: str
    committed: int = 0
    released: bool = False
    #: the scopes that stopped it when it was last tried (its lines)
    blocked: set[str] = field(default_factory=set)


class Model:
    """Limits (root.team, root.team.a), one partition's line, and the policy of both queues."""

    def __init__(self, team: int, a: int, strict: bool) -> None:
        self.limits = {TEAM: team, A: a}
        self.strict = strict
        self.requests: dict[str, Request] = {}
        self.seq = itertools.count()

    def used(self, scope: str) -> int:
        return sum(
            r.amount if r.state == "pending" else r.committed if not r.released else 0
            for r in self.requests.values()
            if r.state in ("pending", "committed") and (scope == TEAM or r.queue == scope)
        )

    def reserved(self) -> int:
        return sum(r.amount for r in self.requests.values() if r.state == "pending")

    def in_use(self) -> int:
        return sum(r.committed for r in self.requests.values() if r.state == "committed" and not r.released)

    def line(self) -> list[Request]:
        waiting = [r for r in self.requests.values() if r.state == "waiting"]
        return sorted(waiting, key=lambda r: (-r.priority, r.seq))

    def scopes(self, queue: str) -> list[str]:
        return [TEAM, A] if queue == A else [TEAM]

    def decide(self, queue: str, amount: int, priority: int, me: Request | None) -> set[str]:
        """The scopes that refuse the request now (empty: admitted)."""
        if self.strict:
            line = self.line()
            ahead = line[: line.index(me)] if me is not None else [r for r in line if r.priority >= priority]
            shared = {s for r in ahead for s in r.blocked if s in self.scopes(queue)}
            if shared:
                return shared
        return {s for s in self.scopes(queue) if self.used(s) + amount > self.limits[s]}

    def grant_pass(self) -> None:
        refused_here: list[Request] = []
        for request in self.line():
            if any(r.queue == request.queue and request.amount >= r.amount for r in refused_here):
                continue  # as the engine does: no less than one refused in this pass, not tried
            refused = self.decide(request.queue, request.amount, request.priority, request)
            if refused:
                request.blocked = refused
                refused_here.append(request)
            else:
                request.state = "pending"


POLICIES = pytest.mark.parametrize("strict", [False, True], ids=["best-effort", "strict"])


@POLICIES
def test_the_line_agrees_with_the_model(
    path_ledger: QuotaEngine, strict: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = path_ledger
    # The test passes over the line itself after each step, so that the model knows when; the
    # engine's own thread would pass over it at a moment of its choosing.
    monkeypatch.setattr(engine.granter, "freed", lambda *_a, **_k: None)
    monkeypatch.setattr(engine.granter, "kick", lambda *_a, **_k: None)

    class Machine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.partition = f"m{next(COUNTER)}"
            self.model = Model(10, 6, strict)
            policy = "StrictFIFO" if strict else "BestEffortFIFO"
            engine.apply_config(
                {
                    "partitions": [
                        {
                            "name": self.partition,
                            "queues": [
                                {
                                    "name": "root",
                                    "queues": [
                                        {
                                            "name": "team",
                                            "properties": {"queueing.policy": policy},
                                            "resources": {"max": {"vcore": "10"}},
                                            "queues": [
                                                {"name": "a", "resources": {"max": {"vcore": "6"}}},
                                                {"name": "b"},
                                            ],
                                        }
                                    ],
                                }
                            ],
                        }
                    ]
                },
                allow_removing_all=True,
            )

        def passed(self) -> None:
            engine.grant_waiting(partition=self.partition)
            self.model.grant_pass()

        @rule(
            queue=st.sampled_from([A, B]),
            amount=st.integers(1, 5),
            priority=st.integers(0, 2),
            wait=st.booleans(),
        )
        def reserve(self, queue: str, amount: int, priority: int, wait: bool) -> None:
            priority = priority if wait else 0
            arguments = {"partition": self.partition, "block": False, "priority": priority}
            if wait and self.model.line():
                # Requests wait already: it joins behind them undecided; a pass grants in order.
                made = engine.reserve(queue, {"vcore": amount}, wait=60, **arguments)
                assert made.state is ReservationState.WAITING
                self.model.requests[made.id] = Request(
                    made.id, queue, amount, priority, next(self.model.seq), "waiting"
                )
                self.passed()
                return
            refused = self.model.decide(queue, amount, priority, None)
            if refused and not wait:
                with pytest.raises(OverQuota) as error:
                    engine.reserve(queue, {"vcore": amount}, **arguments)
                assert {v.scope for v in error.value.violations} == refused
                return
            made = engine.reserve(queue, {"vcore": amount}, wait=60 if wait else None, **arguments)
            if not wait or not refused:
                assert (made.state, refused) == (ReservationState.PENDING, set())
            else:
                assert made.state is ReservationState.WAITING
            state = "pending" if not refused else "waiting"
            self.model.requests[made.id] = Request(
                made.id,
                queue,
                amount,
                priority,
                next(self.model.seq),
                state,
                blocked=refused,
            )

        @rule(data=st.data())
        def rollback(self, data: st.DataObject) -> None:
            live = [r for r in self.model.requests.values() if r.state in ("pending", "waiting")]
            if not live:
                return
            request = data.draw(st.sampled_from(sorted(live, key=lambda r: r.seq)))
            assert engine.rollback(request.id).state is ReservationState.ROLLED_BACK
            request.state = "rolled_back"
            self.passed()

        @rule(data=st.data())
        def commit(self, data: st.DataObject) -> None:
            pending = [r for r in self.model.requests.values() if r.state == "pending"]
            if not pending:
                return
            request = data.draw(st.sampled_from(sorted(pending, key=lambda r: r.seq)))
            amount = data.draw(st.integers(0, request.amount))
            engine.commit(request.id, {"vcore": amount})
            request.state, request.committed = "committed", amount
            self.passed()

        @rule(data=st.data())
        def release(self, data: st.DataObject) -> None:
            held = [r for r in self.model.requests.values() if r.state == "committed" and not r.released]
            if not held:
                return
            request = data.draw(st.sampled_from(sorted(held, key=lambda r: r.seq)))
            engine.release_reservation(request.id)
            request.released = True
            self.passed()

        @rule(data=st.data())
        def run_out(self, data: st.DataObject) -> None:
            # A waiting request's wait runs out: its end is moved to the past (the database
            # clock decides it, so the test does not race it), then the next pass ends it.
            line = self.model.line()
            if not line:
                return
            request = data.draw(st.sampled_from(line))
            with engine.driver.engine.begin() as conn:
                moved = conn.execute(
                    text("UPDATE reservations SET expires_at = :past WHERE id = :id AND state = 'waiting'"),
                    {"past": datetime(2000, 1, 1), "id": request.id},
                ).rowcount
            assert moved == 1
            request.state = "expired"
            self.passed()

        @rule(limit=st.integers(6, 16))
        def set_limit(self, limit: int) -> None:
            engine.set_limits(TEAM, {"vcore": limit}, partition=self.partition)
            self.model.limits[TEAM] = limit
            self.passed()

        @invariant()
        def agrees(self) -> None:
            line = engine.waiting(partition=self.partition)
            assert [r.id for r in line] == [r.id for r in self.model.line()]
            assert [r.position for r in line] == list(range(1, len(line) + 1))
            for request in self.model.requests.values():
                assert engine.get(request.id).state.value == request.state, request
            usage = engine.usage(TEAM, partition=self.partition).get("vcore")
            reserved, in_use = (usage.reserved, usage.in_use) if usage is not None else (0, 0)
            assert (reserved, in_use) == (self.model.reserved() * 1000, self.model.in_use() * 1000)

    run_state_machine_as_test(
        Machine,
        settings=settings(
            max_examples=12,
            stateful_step_count=14,
            deadline=None,
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        ),
    )
    assert engine.audit() == []
