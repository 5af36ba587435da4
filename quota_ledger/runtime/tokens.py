"""Bearer tokens for the HTTP service: issued once, stored as SHA-256 hashes, checked in
constant time. Roles nest: ``reader`` < ``service`` < ``admin``. ``admission`` stands apart: it may
call the admission webhook and nothing else (``admin`` may call it too). A token may be restricted
to one partition and one queue subtree."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from datetime import datetime

from quota_ledger.driver import tokens as statements
from quota_ledger.driver.tx import LedgerTx
from quota_ledger.engine import QuotaEngine
from quota_ledger.model import queues
from quota_ledger.model.errors import InvalidRequest, NotFound

ROLES = ("reader", "service", "admin", "admission")
#: the roles that nest, each allowed what the ones before it are
_NESTED = ("reader", "service", "admin")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
PREFIX = "qlt_"


@dataclass(frozen=True, slots=True)
class Token:
    name: str
    role: str
    partition: str | None = None
    queue: str | None = None
    created_at: datetime | None = None
    revoked_at: datetime | None = None

    def allows(self, role: str) -> bool:
        if role == "admission":
            return self.role in ("admission", "admin")
        # Outside the nest (admission): no role of it, whatever the order of ROLES.
        return self.role in _NESTED and _NESTED.index(self.role) >= _NESTED.index(role)

    def covers(self, partition: str | None, queue: str | None) -> bool:
        """Whether a request on ``partition``/``queue`` is inside this token's restriction.

        ``None`` means the request concerns the whole partition (or every partition).
        """
        if self.partition is not None and partition != self.partition:
            return False
        return self.queue is None or (queue is not None and queues.in_subtree(queue, self.queue))


class TokenNotFound(NotFound):
    """No active token has this name."""


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def add(
    engine: QuotaEngine,
    name: str,
    role: str,
    *,
    partition: str | None = None,
    queue: str | None = None,
    replace: bool = False,
) -> str:
    """Create a token and return it; only its hash is stored, so this is the only time it is seen.

    With ``replace``, a token of that name (active or revoked) is replaced in the same
    transaction: its old value stops working, and names do not pile up.
    """
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidRequest("token names are 1-64 letters, digits, '.', '_' or '-'", field="name")
    if role not in ROLES:
        raise InvalidRequest(f"role must be one of {', '.join(ROLES)}", field="role")
    if partition is not None:
        queues.validate_partition(partition)
    if queue is not None:
        queues.validate_queue(queue)
    token = PREFIX + secrets.token_urlsafe(32)

    def work(tx: LedgerTx) -> None:
        if replace:
            statements.remove(tx.conn, name)
        statements.add(
            tx.conn,
            name=name,
            token_hash=digest(token),
            role=role,
            partition=partition,
            queue=queue,
            now=tx.db_now(),
        )

    engine.driver.run(work)
    return token


def listing(engine: QuotaEngine) -> list[Token]:
    rows = engine.driver.run(lambda tx: statements.listing(tx.conn))
    return [Token(r.name, r.role, r.partition, r.queue, r.created_at, r.revoked_at) for r in rows]


def revoke(engine: QuotaEngine, name: str) -> None:
    if not engine.driver.run(lambda tx: statements.revoke(tx.conn, name, tx.db_now())):
        raise TokenNotFound(f"no active token named {name!r}")


def verify(engine: QuotaEngine, token: str) -> Token | None:
    """The active token matching ``token``, or None."""
    if not token.startswith(PREFIX) or len(token) > 200:
        return None
    wanted = digest(token)
    row = engine.driver.run(lambda tx: statements.find(tx.conn, wanted))
    if row is None or not hmac.compare_digest(row.token_hash, wanted):
        return None
    return Token(row.name, row.role, row.partition, row.queue)
