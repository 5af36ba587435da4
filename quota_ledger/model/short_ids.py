"""Short reservation ids: a unique prefix names a reservation, as git accepts a short hash.

Ids are UUIDs (``8f14e45f-ceea-467f-a0e7-9c2d3b1e5a11``). A prefix of at least
:data:`MIN_PREFIX` characters that only one reservation's id starts with stands for that id;
one that several start with is refused with the candidates, so a typo never resolves a
different reservation than the one meant.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from quota_ledger.model.errors import AmbiguousReservationId, ReservationIdTooShort, ReservationNotFound

#: git's shortest abbreviation too; a 4-digit prefix is unique among a few hundred ids
MIN_PREFIX = 4
#: a full id: used as it is, without looking for prefixes
FULL_LENGTH = 36
#: candidates listed when a prefix is ambiguous
SHOWN_CANDIDATES = 5
#: what a prefix may hold: the lowercase hex digits and hyphens of a UUID, a digit first
PREFIX = "[0-9a-f][0-9a-f-]*"
_PREFIX = re.compile(PREFIX, re.ASCII)

#: (prefix, limit) -> up to ``limit`` ids starting with the prefix, in order
Lookup = Callable[[str, int], list[str]]


def resolve(text: str, lookup: Lookup) -> str:
    """The full reservation id ``text`` stands for (``text`` itself when it is a full id)."""
    if len(text) >= FULL_LENGTH:
        return text
    prefix = text.strip().lower()
    if len(prefix) < MIN_PREFIX:
        raise ReservationIdTooShort(text, MIN_PREFIX)
    if not _PREFIX.fullmatch(prefix):
        raise ReservationNotFound(text)  # no id has other characters
    found = lookup(prefix, SHOWN_CANDIDATES + 1)
    if not found:
        raise ReservationNotFound(text)
    if len(found) > 1:
        raise AmbiguousReservationId(text, found[:SHOWN_CANDIDATES], more=len(found) > SHOWN_CANDIDATES)
    return found[0]
