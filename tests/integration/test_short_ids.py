"""Short reservation ids: the prefix lookup on every backend, and how a prefix resolves."""

from __future__ import annotations

import pytest

from quota_ledger import QuotaEngine
from quota_ledger.model import short_ids
from quota_ledger.model.errors import AmbiguousReservationId, ReservationIdTooShort, ReservationNotFound
from quota_ledger.runtime import overview


def test_the_prefix_lookup_finds_exactly_the_ids_that_start_with_it(ledger: QuotaEngine) -> None:
    ids = sorted(ledger.reserve("root.a", {"fpga": 1}).id for _ in range(40))
    # every first character (40 ids over 16 digits: some are shared), with '9' and 'f' at the
    # ends of the ranges the lookup builds, and prefixes that end on or run past a hyphen
    prefixes = {*"0123456789abcdef", ids[0][:8], ids[0][:9], ids[0][:11], ids[-1][:10], ids[5]}
    for prefix in sorted(prefixes):
        expected = [i for i in ids if i.startswith(prefix)]
        assert overview.reservation_ids(ledger, prefix, 100) == expected, prefix
    assert overview.reservation_ids(ledger, ids[3][:1], 1) == [i for i in ids if i[0] == ids[3][0]][:1]
    assert overview.reservation_ids(ledger, "----", 5) == []


def test_a_unique_prefix_resolves_and_others_are_refused_with_the_reason(ledger: QuotaEngine) -> None:
    ids = sorted(ledger.reserve("root.a", {"fpga": 1}).id for _ in range(3))

    def lookup(prefix: str, limit: int) -> list[str]:
        return overview.reservation_ids(ledger, prefix, limit)

    assert short_ids.resolve(ids[1], lookup) == ids[1]
    assert short_ids.resolve(ids[1][:12].upper(), lookup) == ids[1]
    with pytest.raises(ReservationIdTooShort) as short:
        short_ids.resolve(ids[1][:3], lookup)
    assert short.value.minimum == short_ids.MIN_PREFIX
    with pytest.raises(ReservationNotFound):
        short_ids.resolve("zzzz", lookup)


def test_an_ambiguous_prefix_lists_a_few_candidates() -> None:
    many = [f"abcd{n:04x}-0000-4000-8000-000000000000" for n in range(9)]

    def lookup(prefix: str, limit: int) -> list[str]:
        return [i for i in many if i.startswith(prefix)][:limit]

    with pytest.raises(AmbiguousReservationId) as ambiguous:
        short_ids.resolve("abcd", lookup)
    assert ambiguous.value.candidates == many[: short_ids.SHOWN_CANDIDATES]
    assert ambiguous.value.more
    assert str(ambiguous.value).endswith(", ...")
    assert short_ids.resolve("abcd0003", lookup) == many[3]
