"""Calls of the ledger's PostgreSQL functions, and the one place that says what each declines.

The rule (:mod:`quota_ledger.model.charges`, run by each operation's general path) decides on
every backend. On PostgreSQL set functions may decide first, for speed, each for any number
of requests, one included (their sources are ``quota_ledger/driver/sql/``; the migrations
install them). Each decides exactly as the general path would, one request after another, in the
same lock order; the differential test (``tests/integration/test_differential.py``) holds them
to the rule. What one declines, it leaves untouched, and the general path decides it:

``quota_ledger_reserve_many`` (a partition's reserves, one configuration version) declines
  - every request, when the configuration in force is not the version it was given (the caller's
    compiled copy is out of date: the general path reads the one in force);
  - a request whose reservation id or idempotency key exists (a retry: the general path returns
    the reservation, or raises the key's conflict);
  - one naming a resource the partition names nowhere yet (the general path checks the
    partition's bound of resource names);
  - one whose application row is finished or another user's or queue's (the general path
    starts a new run, or refuses it), and a later request of a new application whose first
    request was declined;
  - one whose user/group or ResourceQuota counter is missing, or needing a user's copy of a
    wildcard limit that an earlier request of the same call could change (the general path
    creates them under its own locks);
  - the first request that does not fit, and every one after it (the general path raises the
    refusal with every violation; the ones after see the state it leaves).
  The caller leaves to the general path, without calling, a request the admission rules of its
  ResourceQuotas or the partition's unknown names refuse (:func:`.reserve_function.quota_charges`), so
  that the refusal is raised with the configuration in force.
``quota_ledger_commit_many`` (whole commits) declines an id that is not a pending reservation
  in time (the general path returns a committed one, expires a late one on the spot, or raises),
  a repeat of an id in the call, one with nothing reserved, a tracked one whose application row
  is missing, and every one when a counter or an application's usage would pass the bigint range
  (the general path raises :class:`CounterOverflow`). Partial commits go to the general path.
``quota_ledger_release`` (a rollback of one pending reservation, or a release of one committed,
  inside the caller's transaction) declines one in any other state (released, waiting, resolved),
  a tracked one (a user or an application), one whose queue has a ResourceQuota counter for a
  resource of its Kubernetes usage, one that holds nothing, and one whose queue counters hold less
  than it gives back (the general path raises).
``quota_ledger_grant`` (one waiting request, in a pass or in the transaction that freed
  capacity) declines a request whose wait ran out (the general path ends it) and whatever
  ``quota_ledger_reserve_many`` declines for it; a request that no longer waits it answers as
  such. The caller leaves a partition with a ``StrictFIFO`` queue to the general path.
``quota_ledger_expire`` (the sweep) expires plain reservations (no user, no application) of
  queues no ResourceQuota counts; it declines a whole batch (``QL001``) when the configuration
  changed, and the general batches sweep the rest.

A call runs in autocommit as its own transaction (:func:`call`), or inside a batch's transaction
(group commit), where it never aborts the transaction.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from sqlalchemy import Connection, Engine, exc

from quota_ledger.driver.dialect import ADVISORY_NAMESPACE, advisory_key
from quota_ledger.driver.pg_cursor import Call, with_text_arrays
from quota_ledger.model.requests import Identity, ReserveRequest

# psycopg is imported by the call, not with this module: SQLite and MariaDB never load it.

#: SQLSTATE of a function that leaves the case to the general path
DECLINED = "QL001"
#: SQLSTATE of a function that does not exist (a schema before 0004)
UNDEFINED_FUNCTION = "42883"

# A batch's reserves of one partition, and its whole commits, as one call each (0012).
RESERVE_MANY = (
    "SELECT * FROM quota_ledger_reserve_many(%(partition)s, %(version)s, %(ns)s, %(k)s, %(ids)s::text[],"
    " %(keys)s::text[], %(request_hashes)s::text[], %(queues)s::text[], %(groups)s::text[],"
    " %(ttl_us)s::bigint[], %(priority_classes)s::text[], %(kubes)s::text[], %(users)s::text[],"
    " %(applications)s::text[], %(app_keys)s::text[], %(app_groups)s::text[], %(item_owners)s::integer[],"
    " %(item_resources)s::text[], %(item_amounts)s::bigint[], %(id_owners)s::integer[], %(id_kinds)s::text[],"
    " %(id_names)s::text[], %(id_queues)s::text[], %(id_resources)s::text[], %(id_amounts)s::bigint[],"
    " %(id_limits)s::bigint[], %(quota_owners)s::integer[], %(quota_names)s::text[],"
    " %(quota_resources)s::text[], %(quota_amounts)s::bigint[])"
)
COMMIT_MANY = "SELECT * FROM quota_ledger_commit_many(%(ids)s::text[], %(ops)s::text[], %(guard)s)"
# whether the set functions are installed (a schema at 0012 or later)
HAS_SET_FUNCTIONS = (
    "SELECT to_regproc('quota_ledger_reserve_many') IS NOT NULL"
    " AND to_regproc('quota_ledger_commit_many') IS NOT NULL"
)
# What one plain reservation holds given back (a rollback, a release), inside the caller's
# transaction, and the grant of one waiting request (0019).
RELEASE_FUNCTION = "quota_ledger_release"
RELEASE = "SELECT * FROM quota_ledger_release(%(id)s, %(op)s, %(committed)s)"
GRANT_FUNCTION = "quota_ledger_grant"
GRANT = RESERVE_MANY.replace("quota_ledger_reserve_many(", "quota_ledger_grant(%(grant)s, %(notice)s, ")
# whether the database has a function (one of a later revision than the set functions)
INSTALLED = "SELECT to_regproc(%(name)s) IS NOT NULL"
EXPIRE = "SELECT quota_ledger_expire(%(partition)s, %(limit)s, %(skip)s::text[], %(version)s, %(ns)s, %(k)s)"


def set_functions_installed(conn: Connection) -> bool:
    """Whether the database has the set functions (a schema at 0012 or later)."""
    return bool(conn.exec_driver_sql(HAS_SET_FUNCTIONS).scalar())


class Unavailable(Exception):
    """The database has no ledger functions (its schema predates revision 0004)."""


def call(engine: Engine, sql: str, params: Mapping[str, Any]) -> list[Any] | None:
    """Run one function call as its own transaction; None when the function declined. Every
    array parameter of the ledger's function calls is cast in its SQL, so lists are sent in
    PostgreSQL's text form (:func:`.pg_cursor.with_text_arrays`).

    Errors come back as SQLAlchemy's ``DBAPIError`` (with ``connection_invalidated`` set when
    the connection died), also when no connection could be opened, so the driver retries them
    exactly as it retries a transaction.
    """
    import psycopg
    from psycopg.rows import namedtuple_row

    try:
        proxied = engine.raw_connection()
    except psycopg.Error as error:
        # The pool hands out the driver's own error when it cannot connect (SQLAlchemy wraps
        # it only for engine.connect()): wrap it here so the driver retries it like any other.
        raise exc.DBAPIError.instance(sql, dict(params), error, psycopg.Error) from error
    try:
        raw: psycopg.Connection[Any] = proxied.driver_connection  # type: ignore[assignment]
        try:
            raw.autocommit = True
            try:
                with raw.cursor(row_factory=namedtuple_row) as cur:
                    return cur.execute(sql, with_text_arrays(params)).fetchall()
            finally:
                if not raw.closed:
                    raw.autocommit = False
        except psycopg.Error as error:
            if error.sqlstate == DECLINED:
                return None
            if error.sqlstate == UNDEFINED_FUNCTION:
                raise Unavailable() from error
            dead = bool(raw.closed)
            if dead:
                proxied.invalidate(error)
            raise exc.DBAPIError.instance(
                sql, dict(params), error, psycopg.Error, connection_invalidated=dead
            ) from error
    finally:
        proxied.close()


def reserve_params(
    request: ReserveRequest, version: int, charges: Sequence[tuple[str, str, int]], identity: Identity
) -> dict[str, Any]:
    """``request``'s part of a ``quota_ledger_reserve_many`` call under configuration ``version``,
    charged to the ResourceQuota counters ``charges`` names and the counters of ``identity``."""
    resources = request.resources
    names = sorted(resources)
    counters = identity.counters
    ttl = timedelta(seconds=request.ttl_seconds)
    return {
        "id": request.reservation_id,
        "partition": request.partition,
        "key": request.key,
        "request_hash": request.request_hash,
        "queue": request.queue,
        "resources": names,
        "amounts": [resources[name] for name in names],
        "ttl_us": ttl // timedelta(microseconds=1),
        "priority_class": request.priority_class,
        "kube": json.dumps(request.kube, sort_keys=True, separators=(",", ":")),
        "version": version,
        "ns": ADVISORY_NAMESPACE,
        "k": advisory_key(request.partition),
        "quota_names": [key for key, _, _ in charges],
        "quota_resources": [name for _, name, _ in charges],
        "quota_amounts": [amount for _, _, amount in charges],
        "user": identity.user,
        "groups": json.dumps(list(identity.groups)) if identity.groups else None,
        "application": identity.application,
        "app_key": identity.app_key,
        "group": identity.group,
        "id_kinds": [c[0] for c in counters],
        "id_names": [c[1] for c in counters],
        "id_queues": [c[2] for c in counters],
        "id_resources": [c[3] for c in counters],
        "id_amounts": [c[4] for c in counters],
        "id_limits": [c[5] for c in counters],
    }


def reserve_many(calls: list[Mapping[str, Any]]) -> Call:
    """One call of ``ledger_reserve_many`` for requests of one partition and configuration
    version, from the parameters of their own calls (:func:`reserve_params`): each request's
    items, user/group counters and ResourceQuota charges flattened, each with its request's place
    (1-based). It never aborts the transaction: what it declines, it leaves untouched."""
    first = calls[0]
    numbered = list(enumerate(calls, 1))
    return Call(
        RESERVE_MANY,
        {
            "partition": first["partition"],
            "version": first["version"],
            "ns": first["ns"],
            "k": first["k"],
            "ids": [c["id"] for c in calls],
            "keys": [c["key"] for c in calls],
            "request_hashes": [c["request_hash"] for c in calls],
            "queues": [c["queue"] for c in calls],
            "groups": [c["groups"] for c in calls],
            "ttl_us": [c["ttl_us"] for c in calls],
            "priority_classes": [c["priority_class"] for c in calls],
            "kubes": [c["kube"] for c in calls],
            "users": [c["user"] for c in calls],
            "applications": [c["application"] for c in calls],
            "app_keys": [c["app_key"] for c in calls],
            "app_groups": [c["group"] for c in calls],
            "item_owners": [n for n, c in numbered for _ in c["resources"]],
            "item_resources": [r for c in calls for r in c["resources"]],
            "item_amounts": [a for c in calls for a in c["amounts"]],
            "id_owners": [n for n, c in numbered for _ in c["id_kinds"]],
            **{f"id_{f}": [v for c in calls for v in c[f"id_{f}"]] for f in _ID_FIELDS},
            "quota_owners": [n for n, c in numbered for _ in c["quota_names"]],
            **{f"quota_{f}": [v for c in calls for v in c[f"quota_{f}"]] for f in _QUOTA_FIELDS},
        },
        arrays_as_text=True,
    )


_ID_FIELDS = ("kinds", "names", "queues", "resources", "amounts", "limits")
_QUOTA_FIELDS = ("names", "resources", "amounts")


def commit_params(reservation_id: str, operation_id: str) -> dict[str, Any]:
    return {"id": reservation_id, "op": operation_id}


def commit_many(calls: list[Mapping[str, Any]], guard: bool = True) -> Call:
    """One call of ``ledger_commit_many`` for whole commits, from their own parameters
    (:func:`commit_params`); ``guard``: a tracked one without its application row is declined
    alone (else the call aborts with ``QL001``)."""
    ids, ops = [c["id"] for c in calls], [c["op"] for c in calls]
    return Call(COMMIT_MANY, {"ids": ids, "ops": ops, "guard": guard}, arrays_as_text=True)


def expire_params(partition: str, limit: int, skip: Sequence[str], version: int) -> dict[str, Any]:
    """The arguments of ``ledger_expire``: up to ``limit`` plain reservations of ``partition``,
    none in a queue of ``skip``, while configuration ``version`` is in force."""
    return {
        "partition": partition,
        "limit": limit,
        "skip": list(skip),
        "version": version,
        "ns": ADVISORY_NAMESPACE,
        "k": advisory_key(partition),
    }
