"""Amounts a person reads are in each resource's own units; JSON keeps base units."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quota_ledger.model.errors import InvalidCommit, OverQuota, UsageUnderflow
from quota_ledger.model.quantity import MAX_QUANTITY, format_human, is_bytes, parse_quantity
from quota_ledger.model.values import Violation


@pytest.mark.parametrize(
    ("resource", "units", "text"),
    [
        ("vcore", 0, "0"),
        ("vcore", 4000, "4"),
        ("vcore", 250, "250m"),
        ("cpu", 1500, "1500m"),
        ("memory", 0, "0"),
        ("memory", 8 * 2**30, "8Gi"),
        ("memory", 1536 * 2**20, "1536Mi"),  # binary when exact, even if not a whole Gi
        ("memory", 2**30 * 1000, "1000Gi"),
        ("memory", 10**9, "1G"),  # not a binary multiple: decimal when exact
        ("memory", 1500, "1500"),  # neither: plain bytes
        ("memory", 1000, "1k"),
        ("ephemeral-storage", 2**40, "1Ti"),
        ("requests.memory", 2**20, "1Mi"),
        ("gold.storageclass.storage.k8s.io/requests.storage", 5 * 2**30, "5Gi"),
        ("hugepages-2Mi", 2**21, "2Mi"),
        ("pods", 10_000, "10000"),  # counts stay plain: no "10k"
        ("nvidia.com/gpu", 1024, "1024"),
        ("applications", 3, "3"),
        ("memory", -2 * 2**30, "-2Gi"),
        ("vcore", -500, "-500m"),
    ],
)
def test_format_human_uses_the_resources_own_unit(resource: str, units: int, text: str) -> None:
    assert format_human(resource, units) == text


def test_milli_can_be_forced_for_kubernetes_cpu_names() -> None:
    assert format_human("requests.cpu", 250, milli=True) == "250m"
    assert format_human("requests.cpu", 250) == "250"  # a queue resource of that name is a count


def test_byte_resources_are_recognised_by_their_last_name() -> None:
    assert is_bytes("limits.ephemeral-storage")
    assert not is_bytes("nvidia.com/gpu")
    assert not is_bytes("count/pods")


@given(
    resource=st.sampled_from(["memory", "vcore", "storage", "fpga"]),
    units=st.integers(min_value=0, max_value=MAX_QUANTITY),
)
def test_format_human_parses_back_to_the_same_amount(resource: str, units: int) -> None:
    assert parse_quantity(resource, format_human(resource, units)) == units


def test_over_quota_reads_like_kubectl_describe_quota_and_keeps_base_units() -> None:
    violation = Violation(
        scope="root.a", resource="memory", limit=8 * 2**30, in_use=0, reserved=0, requested=9 * 2**30
    )
    error = OverQuota([violation])
    assert str(error) == (
        "over quota: memory at root.a: limit 8Gi, in use 0, reserved 0, requested 9Gi, available 8Gi"
    )
    assert dataclasses.asdict(error.violations[0])["limit"] == 8 * 2**30


def test_user_and_quota_violations_name_who_and_use_milli_cores() -> None:
    user = Violation(
        scope="root.dev",
        resource="vcore",
        limit=2000,
        in_use=500,
        reserved=0,
        requested=3000,
        kind="user",
        name="bob",
    )
    assert user.describe() == (
        "vcore at root.dev for user bob: limit 2, in use 500m, reserved 0, requested 3, available 1500m"
    )
    quota = Violation(
        scope="ns/q",
        resource="requests.cpu",
        limit=1000,
        in_use=1200,
        reserved=0,
        requested=100,
        kind="quota",
    )
    assert quota.describe() == (
        "requests.cpu in quota ns/q: limit 1, in use 1200m, reserved 0, requested 100m, available -200m"
    )


def test_usage_underflow_speaks_in_the_resources_units() -> None:
    error = UsageUnderflow("default", "root.a", {"memory": (2**30, 2 * 2**30), "vcore": (0, 500)})
    assert str(error) == (
        "cannot release more than is in use at root.a: memory: in use 1Gi, release 2Gi, "
        "vcore: in use 0, release 500m"
    )
    assert error.shortfalls["memory"] == (2**30, 2 * 2**30)


def test_a_partial_commit_over_the_reservation_is_refused_in_human_units() -> None:
    from datetime import UTC, datetime

    from quota_ledger.model.arguments import commit_amounts
    from quota_ledger.model.values import Reservation, ReservationState

    now = datetime.now(UTC)
    reservation = Reservation(
        id="r",
        state=ReservationState.PENDING,
        partition="default",
        queue="root.a",
        resources={"memory": 2**30},
        created_at=now,
        expires_at=now,
    )
    with pytest.raises(InvalidCommit, match=r"memory: reserved 1Gi, commit 2Gi"):
        commit_amounts(reservation, {"memory": 2 * 2**30})


def test_the_audit_table_reads_in_human_units() -> None:
    from quota_ledger.cli.output import drift_table
    from quota_ledger.model.values import Drift

    drifts = [
        Drift(
            partition="default",
            scope_type="queue",
            scope="root.a",
            resource="memory",
            in_use=2**30,
            reserved=0,
            expected_in_use=2**30,
            expected_reserved=512 * 2**20,
        ),
        Drift(
            partition="default",
            scope_type="quota",
            scope="team/q",
            resource="requests.cpu",
            in_use=0,
            reserved=250,
            expected_in_use=0,
            expected_reserved=0,
            fixed=True,
        ),
        Drift(
            partition="default",
            scope_type="user",
            scope="root",
            resource="vcore",
            in_use=1000,
            reserved=0,
            expected_in_use=0,
            expected_reserved=0,
            name="sue",
        ),
    ]
    lines = [line.split() for line in drift_table(drifts).splitlines()]
    assert lines[0] == ["PARTITION", "TYPE", "SCOPE", "RESOURCE", "IN", "USE/RESERVED", "EXPECTED", "STATUS"]
    assert lines[1] == ["default", "queue", "root.a", "memory", "1Gi/0", "1Gi/512Mi", "not", "fixed"]
    assert lines[2] == ["default", "quota", "team/q", "requests.cpu", "0/250m", "0/0", "fixed"]
    assert lines[3] == ["default", "user", "root", "(sue)", "vcore", "1/0", "0/0", "not", "fixed"]
