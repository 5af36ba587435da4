"""Kueue's queue ordering, pkg/queue/cluster_queue_test.go (kubernetes-sigs/kueue), on the
ledger's waiting line, on every backend.

Kueue pops a ClusterQueue's workloads by priority, then creation time; the ledger grants a
partition's waiting requests by priority, then arrival. A "pop" here is the request granted when
room for exactly one frees: each case holds a queue's one unit, lines requests up, frees the unit
and sees which request was granted. Creation time is arrival: the cases join in the order of
their creation timestamps. Not ported: a workload updated with an earlier creation timestamp
(``TestFIFOClusterQueue``'s second half: a waiting request's arrival never changes), eviction
and requeue timestamps (``TestStrictFIFO``'s evicted cases; nothing is evicted from the ledger),
inadmissible workloads, namespace selectors and fair sharing (Kueue's scheduler, not its order).
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from quota_ledger import QuotaEngine, ReservationState

FILE = "pkg/queue/cluster_queue_test.go"
QUEUE = "root.cq"
CONFIG = """
partitions:
- name: default
  queues:
  - name: root
    queues:
    - name: cq
      properties: {{queueing.policy: {policy}}}
      resources: {{max: {{vcore: 1}}}}
"""
LOW, HIGH = 0, 1000


@pytest.fixture(params=["StrictFIFO", "BestEffortFIFO"])
def cluster_queue(ledger: QuotaEngine, request: pytest.FixtureRequest) -> QuotaEngine:
    ledger.apply_config(CONFIG.format(policy=request.param))
    return ledger


def popped(ledger: QuotaEngine, line: Sequence[tuple[str, int]]) -> list[str]:
    """Line ``line`` up (name, priority) in that order of arrival behind a held unit, then free
    one unit at a time: the names in the order they were granted."""
    held = ledger.reserve(QUEUE, {"vcore": 1})
    made = {}
    for name, priority in line:
        waiting = ledger.reserve(QUEUE, {"vcore": 1}, wait=60, block=False, priority=priority, key=name)
        made[waiting.id] = name
    order: list[str] = []
    for _ in line:
        ledger.rollback(held.id)
        ledger.grant_waiting()  # (the engine's own thread may have granted it already)
        (granted,) = [
            r
            for r in map(ledger.get, made)
            if r.state is ReservationState.PENDING and made[r.id] not in order
        ]
        order.append(made[granted.id])
        held = granted
    return order


def test_pop(cluster_queue: QuotaEngine) -> None:
    """Test_Pop: workload-1 (now) is popped before workload-2 (a second later), then none."""
    assert popped(cluster_queue, [("workload-1", LOW), ("workload-2", LOW)]) == ["workload-1", "workload-2"]
    assert cluster_queue.waiting() == []


def test_fifo_cluster_queue(cluster_queue: QuotaEngine) -> None:
    """TestFIFOClusterQueue: of "now", "before" (a second earlier) and "after" (a second later),
    "before" is popped first."""
    assert popped(cluster_queue, [("before", LOW), ("now", LOW), ("after", LOW)])[0] == "before"


def test_delete(cluster_queue: QuotaEngine) -> None:
    """Test_Delete: deleting the workloads empties the queue (a rollback takes a waiting
    request out of line)."""
    cluster_queue.reserve(QUEUE, {"vcore": 1})
    one = cluster_queue.reserve(QUEUE, {"vcore": 1}, wait=60, block=False, key="workload-1")
    two = cluster_queue.reserve(QUEUE, {"vcore": 1}, wait=60, block=False, key="workload-2")
    assert len(cluster_queue.waiting()) == 2
    cluster_queue.rollback(one.id)
    assert [r.id for r in cluster_queue.waiting()] == [two.id]
    cluster_queue.rollback(two.id)
    assert cluster_queue.waiting() == []


def test_push_or_update(cluster_queue: QuotaEngine) -> None:
    """Test_PushOrUpdate, "workload doesn't have re-queue state": pushing the same workload
    again updates it and the queue holds one (the same idempotency key queues once)."""
    cluster_queue.reserve(QUEUE, {"vcore": 1})
    first = cluster_queue.reserve(QUEUE, {"vcore": 1}, wait=60, block=False, key="workload-1")
    again = cluster_queue.reserve(QUEUE, {"vcore": 1}, wait=60, block=False, key="workload-1")
    assert again.id == first.id
    assert len(cluster_queue.waiting()) == 1


@pytest.mark.parametrize(
    ("w1", "w2", "expected"),
    [
        pytest.param(HIGH, LOW, "w1", id="w1.priority is higher than w2.priority"),
        pytest.param(LOW, LOW, "w1", id="w1.priority equals w2.priority and w1 was created earlier"),
        pytest.param(LOW, HIGH, "w2", id="w1.priority is lower than w2.priority and w1 was created earlier"),
    ],
)
def test_strict_fifo(cluster_queue: QuotaEngine, w1: int, w2: int, expected: str) -> None:
    """TestStrictFIFO: priority first, then creation time."""
    assert popped(cluster_queue, [("w1", w1), ("w2", w2)])[0] == expected
