"""The long form of the Galera failover test (``scripts/cluster galera soak``): the same load,
measured in phases of ``seconds`` each, in one run:

1. ``standalone``: one ``mariadbd`` made and configured like a cluster node, ``wsrep_on = OFF``;
2. ``single-writer``: every client on the node list [n1, n2, n3], so all write on node 1;
3. ``failover``: the same, with node 1 killed (``kill -9``) a third of the way in; the recovery
   is the time from the kill to the first answer of an operation sent after it; node 1 then
   rejoins;
4. ``multi-writer``: client ``i`` on the list rotated by ``i``, so every node writes.

Each phase samples every live node for counters over their limits and checks afterwards that
every acknowledged operation is in every node's tables; the cluster phases end with ``audit()``
on every node and the ledger tables compared across nodes.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import ledger_checks
import ledger_load
from galera import GaleraCluster
from ledger_load import Load, LoadResult, Shape
from standalone import StandaloneNode

from quota_ledger import QuotaEngine


@dataclass(kw_only=True)
class Phase:
    name: str
    result: LoadResult
    violations: int
    lost: list[str]
    recovery: float | None = None
    #: a phase that kills the writer: without a recovery time it did not fail over
    fails_over: bool = False
    drifts: int = 0
    identical: bool = True
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        result = self.result
        errors = dict(result.errors) or "none"
        out = [
            f"{self.name}: {result.throughput:.0f} pairs/s ({result.pairs} in {result.seconds:.1f} s)",
            f"  {result.latencies()}",
            f"  refused (OverQuota) {result.refused}, errors {errors}, untyped {len(result.unexpected)}, "
            f"driver retries {dict(result.retries) or 'none'}",
            f"  over-limit samples {self.violations}, lost acknowledgements {len(self.lost)}, "
            f"audit drifts {self.drifts}, tables identical {'yes' if self.identical else 'NO'}",
        ]
        if self.recovery is not None:
            out.append(
                f"  recovery: an operation sent after the kill answered {self.recovery:.2f} s after it"
            )
        out += [f"  {note}" for note in self.notes]
        return out


def _run(
    engines: Sequence[QuotaEngine],
    shape: Shape,
    nodes: Sequence[ledger_checks.Node],
    database: str,
    seconds: float,
    name: str,
    during: Callable[[], None] | None = None,
) -> tuple[LoadResult, ledger_checks.Sampler]:
    sampler = ledger_checks.Sampler(nodes, database).start()
    load = Load(engines, shape, name=name).start()
    try:
        if during is None:
            time.sleep(seconds)
        else:
            during()
    finally:
        result = load.stop()
        sampler.stop()
    return result, sampler


def _checked(
    name: str,
    result: LoadResult,
    sampler: ledger_checks.Sampler,
    nodes: Sequence[ledger_checks.Node],
    database: str,
) -> Phase:
    sums = ledger_checks.wait_identical(nodes, database)
    lost = [line for node in nodes for line in ledger_checks.lost_acks(node, database, result.acks)]
    phase = Phase(
        name=name, result=result, violations=sampler.violations, lost=lost,
        identical=all(s == sums[0] for s in sums),
    )  # fmt: skip
    phase.notes += [f"untyped: {line}" for line in result.unexpected[:5]]
    phase.notes += [f"lost: {line}" for line in lost[:5]]
    return phase


def standalone(seconds: float, shape: Shape) -> Phase:
    node = StandaloneNode.create()
    try:
        node.start()
        url = node.create_database("soak")
        with QuotaEngine.from_url(url) as engine:
            engine.migrate()
            ledger_load.prepare(engine, shape)
            result, sampler = _run([engine], shape, [node], "soak", seconds, "standalone")
        return _checked("standalone MariaDB (no wsrep)", result, sampler, [node], "soak")
    finally:
        node.destroy()


def cluster_phases(cluster: GaleraCluster, seconds: float, shape: Shape) -> list[Phase]:
    database = f"ql_soak_{uuid.uuid4().hex[:8]}"
    urls = cluster.create_database(database)
    phases: list[Phase] = []
    try:
        with ledger_load.connect(urls) as engine:
            engine.migrate()
            ledger_load.prepare(engine, shape)
        ledger_checks.wait_identical(cluster.nodes, database)
        cluster.wait_synced()
        with ledger_load.connect(urls) as engine:
            run = _run([engine], shape, cluster.nodes, database, seconds, "steady")
            phases.append(_checked("Galera single-writer", *run, cluster.nodes, database))
            phases[-1].drifts = _drifts(urls)
            phases.append(_failover(cluster, engine, shape, database, seconds))
        cluster.wait_synced()
        engines = [ledger_load.connect(urls[i:] + urls[:i]) for i in range(len(urls))]
        try:
            run = _run(engines, shape, cluster.nodes, database, seconds, "multi")
        finally:
            for each in engines:
                each.close()
        phases.append(
            _checked("Galera multi-writer (clients spread over 3 nodes)", *run, cluster.nodes, database)
        )
        phases[-1].drifts = _drifts(urls)
    finally:
        if all(node.running() for node in cluster.nodes):
            cluster.nodes[0].query(f"DROP DATABASE IF EXISTS `{database}`")
    return phases


def _failover(
    cluster: GaleraCluster, engine: QuotaEngine, shape: Shape, database: str, seconds: float
) -> Phase:
    writer, *survivors = cluster.nodes
    killed: list[float] = []
    notes: list[str] = []

    def kill_mid_load() -> None:
        time.sleep(seconds / 3)
        on = ledger_checks.writers(cluster.nodes, database)
        if on != [writer.name]:
            notes.append(f"the clients wrote on {on}, not on {writer.name} alone, when it was killed")
        writer.kill()
        killed.append(time.monotonic())
        time.sleep(seconds * 2 / 3)

    result, sampler = _run([engine], shape, cluster.nodes, database, seconds, "failover", kill_mid_load)
    phase = _checked("Galera single-writer, writer killed", result, sampler, survivors, database)
    phase.fails_over = True
    phase.recovery = result.first_answer_after(killed[0]) if killed and not notes else None
    phase.notes += notes
    started = time.monotonic()
    writer.start()
    cluster.wait_size(len(cluster.nodes), on=writer)
    sums = ledger_checks.wait_identical(cluster.nodes, database)
    phase.identical = phase.identical and all(s == sums[0] for s in sums)
    phase.lost += ledger_checks.lost_acks(writer, database, result.acks)
    transfer = "IST" if "IST received" in writer.log_tail(100_000) else "no IST: a full state transfer"
    phase.drifts = _drifts([n.url(database) for n in cluster.nodes])
    phase.notes.append(
        f"node 1 rejoined ({transfer}) in {time.monotonic() - started:.1f} s; tables compared on 3 nodes"
    )
    return phase


def _drifts(urls: Sequence[str]) -> int:
    """Drifts ``audit()`` reports, summed over the nodes."""
    total = 0
    for url in urls:
        with QuotaEngine.from_url(url) as one:
            total += len(one.audit())
    return total


def totals(phases: Sequence[Phase]) -> list[str]:
    """The cluster's throughput against the standalone node's, errors and problems of every phase."""
    lines: list[str] = []
    by_name = {p.name: p.result.throughput for p in phases}
    base = by_name.get("standalone MariaDB (no wsrep)")
    single = by_name.get("Galera single-writer")
    if base and single:
        lines.append(f"single-writer Galera / standalone throughput: {single / base:.2f}")
    errors: Counter[str] = Counter()
    for phase in phases:
        errors.update(phase.result.errors)
    bad = sum(p.violations + len(p.lost) + p.drifts + len(p.result.unexpected) for p in phases)
    bad += sum(not p.identical or (p.fails_over and p.recovery is None) for p in phases)
    lines.append(f"errors by type, all phases: {dict(errors) or 'none'}; problems: {bad}")
    return lines
