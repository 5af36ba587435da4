"""QuotaEngine: the one object service code holds. It decides; the driver reads and writes.

Its calls live in mixins by concern, each a module of this package: reservations, configuration
and limits, Kubernetes objects, usage, maintenance (expiry and audit), on a base that holds the
engine's state and decides prepared operations. This module builds the engine and ends it.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.engine import URL

from quota_ledger.driver.core import DbQuotaDriver
from quota_ledger.engine.base import DEFAULT_TTL
from quota_ledger.engine.configuration import Configuration
from quota_ledger.engine.explanations import Explanations
from quota_ledger.engine.kubernetes import KubernetesObjects
from quota_ledger.engine.maintenance import Maintenance
from quota_ledger.engine.reservations import Reservations
from quota_ledger.engine.usage import UsageReports
from quota_ledger.engine.waiting import DEFAULT_WAIT_POLL_INTERVAL, wait_seconds
from quota_ledger.ledger import group_commit
from quota_ledger.ledger.compiled import CompiledRules
from quota_ledger.ledger.paths import Paths
from quota_ledger.model import validation
from quota_ledger.model.errors import InvalidRequest


class QuotaEngine(Reservations, Explanations, Configuration, KubernetesObjects, UsageReports, Maintenance):
    """Reserve resources against queue limits, then commit or roll back.

    Every method is one database transaction (retried as a whole on transient failures) and
    is all-or-nothing: it either applies completely or raises and changes nothing. With
    ``batching=True``, concurrent reservations, commits, rollbacks and releases of reservations
    are decided together, up to ``max_batch`` per transaction, each with the outcome it would
    have had alone (see :mod:`quota_ledger.ledger.group_commit`).
    """

    def __init__(
        self,
        driver: DbQuotaDriver,
        *,
        default_ttl: float = DEFAULT_TTL,
        max_resources_per_request: int = validation.DEFAULT_MAX_RESOURCES_PER_REQUEST,
        max_resources_per_limit_set: int = validation.DEFAULT_MAX_RESOURCES_PER_LIMIT_SET,
        max_resources_per_partition: int = validation.DEFAULT_MAX_RESOURCES_PER_PARTITION,
        batching: bool = False,
        max_batch: int = group_commit.DEFAULT_MAX_BATCH,
        wait_poll_interval: float = DEFAULT_WAIT_POLL_INTERVAL,
    ) -> None:
        validation.flag(batching, "batching")
        poll = wait_seconds(wait_poll_interval, "wait_poll_interval")
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise InvalidRequest("max_batch must be a positive integer", field="max_batch")
        self.driver = driver
        self.default_ttl = validation.ttl(default_ttl)
        self.bounds = validation.Bounds(
            resources_per_request=max_resources_per_request,
            resources_per_limit_set=max_resources_per_limit_set,
            resources_per_partition=max_resources_per_partition,
        )
        self.rules = CompiledRules()
        self.group_commit = group_commit.GroupCommit(driver, max_batch) if batching else None
        self.paths = Paths(driver, self.rules, self.bounds, self.group_commit)
        self.granter = self._make_granter(poll)

    @classmethod
    def from_url(
        cls,
        url: str | URL | Sequence[str | URL],
        *,
        read_urls: Sequence[str | URL] | None = None,
        default_ttl: float = DEFAULT_TTL,
        pool_size: int = 10,
        echo: bool = False,
        retry_attempts: int = 10,
        retry_seconds: float = 15.0,
        backoff_cap: float = 3.0,
        galera_sync_wait: int = 1,
        retry_refused: bool = True,
        max_resources_per_request: int = validation.DEFAULT_MAX_RESOURCES_PER_REQUEST,
        max_resources_per_limit_set: int = validation.DEFAULT_MAX_RESOURCES_PER_LIMIT_SET,
        max_resources_per_partition: int = validation.DEFAULT_MAX_RESOURCES_PER_PARTITION,
        batching: bool = False,
        max_batch: int = group_commit.DEFAULT_MAX_BATCH,
        wait_poll_interval: float = DEFAULT_WAIT_POLL_INTERVAL,
    ) -> QuotaEngine:
        """An engine on ``postgresql+psycopg://``, ``mysql+pymysql://`` or ``sqlite:///`` URLs.

        ``url`` is one URL, or a list of the writer candidates in order of preference: the
        hosts of a PostgreSQL primary and its standbys (a libpq multi-host URL is fine too), or
        the nodes of a Galera cluster, one of which writes at a time. ``read_urls`` are
        replicas for reads that may be slightly stale. One operation is retried at most
        ``retry_attempts`` times and ``retry_seconds`` long, waits growing up to
        ``backoff_cap`` seconds; the defaults ride out a failover of about 9 s. On Galera the
        writer's sessions set ``wsrep_sync_wait = galera_sync_wait`` (0: not at all). See
        :class:`DbQuotaDriver` and :mod:`quota_ledger.driver.topology`. A connection that
        cannot be opened raises :class:`DatabaseUnreachable` with the host and the driver's
        reason: at once for failed authentication or an unknown database, and for a refused
        connection too when ``retry_refused`` is false (the CLI's choice).

        ``max_resources_per_*`` bound how many resources one request, one limit set and one
        partition may name (:class:`TooManyResources` beyond them).

        ``batching=True`` decides concurrent reservations, commits, rollbacks and releases of
        reservations together, up to ``max_batch`` of them per transaction (group commit: see
        :mod:`quota_ledger.ledger.group_commit`).

        ``wait_poll_interval`` (seconds) is how often the engine tries the waiting lines again
        while callers of it are blocked waiting (``reserve(wait=...)``, :meth:`wait_for`), which
        bounds how long a grant of capacity freed by another process can take.
        """
        return cls(
            DbQuotaDriver.from_url(
                url,
                read_urls=read_urls,
                pool_size=pool_size,
                echo=echo,
                retry_attempts=retry_attempts,
                retry_seconds=retry_seconds,
                backoff_cap=backoff_cap,
                galera_sync_wait=galera_sync_wait,
                retry_refused=retry_refused,
            ),
            default_ttl=default_ttl,
            max_resources_per_request=max_resources_per_request,
            max_resources_per_limit_set=max_resources_per_limit_set,
            max_resources_per_partition=max_resources_per_partition,
            batching=batching,
            max_batch=max_batch,
            wait_poll_interval=wait_poll_interval,
        )

    def migrate(self, revision: str = "head") -> None:
        """Upgrade the schema with Alembic (to ``head`` by default). Safe to call repeatedly."""
        from quota_ledger.driver import migrate

        with self.driver.translated():
            migrate.upgrade(self.driver.engine, revision)
        self.driver.installed.clear()  # (functions a later revision installs are asked for again)
        if self.group_commit is not None:
            self.group_commit.schema_changed()

    def close(self) -> None:
        """Release all database connections. With batching, the requests already queued are
        decided first; later calls raise :class:`DatabaseUnavailable`."""
        self.granter.close()
        if self.group_commit is not None:
            self.group_commit.close()
        self.driver.dispose()

    @property
    def batch_stats(self) -> group_commit.BatchStats:
        """How many batches and requests group commit has decided (zeros without batching)."""
        return self.group_commit.stats if self.group_commit is not None else group_commit.BatchStats()

    def __enter__(self) -> QuotaEngine:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
