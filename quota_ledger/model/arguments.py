"""Partial commits, idempotency and request fingerprints: pure, before any transaction.

Names and request shapes are checked by :mod:`quota_ledger.model.validation`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from quota_ledger.model.errors import IdempotencyConflict, InvalidCommit, InvalidRequest
from quota_ledger.model.quantity import format_human
from quota_ledger.model.values import Reservation, StoredReservation


def commit_amounts(reservation: Reservation, partial: Mapping[str, int] | None) -> dict[str, int]:
    if partial is None:
        return dict(reservation.resources)
    extra = sorted(set(partial) - set(reservation.resources))
    if any(partial[res] > 0 for res in extra):
        raise InvalidCommit(f"resources not reserved: {', '.join(extra)}", field=extra[0])
    too_much = [res for res in reservation.resources if partial.get(res, 0) > reservation.resources[res]]
    if too_much:
        detail = ", ".join(
            f"{res}: reserved {format_human(res, reservation.resources[res])}, "
            f"commit {format_human(res, partial[res])}"
            for res in too_much
        )
        raise InvalidCommit(f"cannot commit more than was reserved: {detail}", field=too_much[0])
    return {res: partial.get(res, 0) for res in reservation.resources}


def same_request(found: StoredReservation, partition: str, key: str, request_hash: str) -> Reservation:
    if found.request_hash != request_hash:
        raise IdempotencyConflict(partition, key, found.reservation.id)
    return found.reservation


def request_hash(
    partition: str,
    queue: str,
    amounts: Mapping[str, int],
    groups: tuple[str, ...],
    identity: Mapping[str, Any],
) -> str:
    # ttl is left out on purpose: a retry that recomputes its deadline is the same request.
    canonical = json.dumps(
        {"p": partition, "q": queue, "r": amounts, "g": sorted(groups), **identity},
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def read_path(source: Any) -> Any:
    """A path names a file to read; text, bytes and dicts are configurations themselves."""
    if isinstance(source, Path):
        try:
            return source.read_text()
        except OSError as error:
            raise InvalidRequest(f"cannot read {source}: {error.strerror}", field="config") from error
    return source
