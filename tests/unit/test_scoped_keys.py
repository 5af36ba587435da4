"""Scoped keys (quota_ledger.http.scoped): a token restricted to a queue always sees the key it
sent; nothing else is mistaken for a scoped key."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

from quota_ledger.http import scoped
from quota_ledger.model.errors import OverQuota
from quota_ledger.model.values import Reservation, ReservationState, Violation
from quota_ledger.runtime.tokens import Token

NOW = datetime(2026, 1, 1, tzinfo=UTC)
TEAM = Token("team", "service", queue="root.a")
NARROW = Token("narrow", "service", queue="root.a.x")
EVERYONE = Token("all", "service")


def _reservation(queue: str, key: str | None) -> Reservation:
    return Reservation(
        id="r", state=ReservationState.PENDING, partition="default", queue=queue, resources={"fpga": 1},
        created_at=NOW, expires_at=NOW, key=key,
    )  # fmt: skip


def test_a_scoped_key_is_shown_as_sent_to_tokens_inside_its_scope() -> None:
    stored = scoped.scoped_key(TEAM, "default", "req-1")
    assert stored is not None
    assert stored.startswith("req-1~")
    made = _reservation("root.a.x", stored)
    assert scoped.shown(TEAM, made).key == "req-1"
    assert scoped.shown(NARROW, made).key == "req-1"  # made by a token of an ancestor scope
    assert scoped.shown(EVERYONE, made).key == stored  # the stored key, as the Python API sees it


def test_a_key_of_the_scoped_shape_with_another_tag_is_shown_as_it_is() -> None:
    stored = scoped.scoped_key(TEAM, "default", "req-1")
    assert stored is not None
    for key in (stored[:-1] + ("0" if stored[-1] != "0" else "1"), "req-1~", "~", "plain"):
        assert scoped.shown(TEAM, _reservation("root.a", key)).key == key
    # the tag names the partition: the same text in another partition is no scoped key
    other = dataclasses.replace(_reservation("root.a", stored), partition="gpu")
    assert scoped.shown(TEAM, other).key == stored


def test_only_queue_restricted_tokens_and_keys_short_enough_have_a_scoped_form() -> None:
    assert scoped.scoped_key(EVERYONE, "default", "k") is None
    assert scoped.scoped_key(Token("p", "service", partition="default"), "default", "k") is None
    longest = "k" * scoped.MAX_SCOPED_KEY
    assert len(scoped.scoped_key(TEAM, "default", longest) or "") == 255
    assert scoped.scoped_key(TEAM, "default", longest + "k") is None


def test_release_keys_of_restricted_tokens_are_their_own() -> None:
    assert scoped.release_key(EVERYONE, "default", "r") == "r"
    mine, narrow = scoped.release_key(TEAM, "default", "r"), scoped.release_key(NARROW, "default", "r")
    assert mine != "r"
    assert mine != narrow
    assert scoped.release_key(TEAM, "default", 7) == 7  # left for the engine to refuse


def test_a_limit_above_the_subtree_is_refused_without_its_usage() -> None:
    above = Violation(scope="root", resource="fpga", limit=4, in_use=1, reserved=2, requested=3)
    inside = Violation(scope="root.a", resource="fpga", limit=3, in_use=0, reserved=1, requested=3)
    refused = scoped.refusal(TEAM, OverQuota([above, inside]))
    assert isinstance(refused, scoped.ScopedOverQuota)
    assert scoped.violations_body(refused) == [
        dataclasses.asdict(above) | {"in_use": None, "reserved": None, "shortfall": 2},
        dataclasses.asdict(inside) | {"shortfall": 1},
    ]
    assert "reserved 2" not in str(refused)
    assert "fpga at root: limit 4, requested 3, over by 2" in str(refused)
    assert "fpga at root.a: limit 3, in use 0, reserved 1" in str(refused)
    unrestricted = OverQuota([above])
    assert scoped.refusal(EVERYONE, unrestricted) is unrestricted
