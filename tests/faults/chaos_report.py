"""What a fault-injection run saw, and the table ``scripts/chaos`` prints and the docs quote."""

from __future__ import annotations

import threading
from collections import Counter as Tally
from dataclasses import dataclass, field

from chaos_callers import SERVED, UNEXPECTED, UNTYPED, Reply

from quota_ledger.ledger.group_commit import BatchStats


@dataclass
class FaultRecord:
    phase: str
    kind: str
    at: float  # monotonic
    restored: float
    offset: float  # seconds into the phase
    recovery: float | None = None


@dataclass
class Stats:
    lock: threading.Lock = field(default_factory=threading.Lock)
    served: Tally[str] = field(default_factory=Tally)  # "phase op" -> calls served
    errors: Tally[str] = field(default_factory=Tally)  # error as seen -> count
    untyped: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    gave_up: int = 0
    timeline: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # worker -> served

    def record(self, worker: str, op: str, reply: Reply, started: float, ended: float) -> None:
        with self.lock:
            if reply.error is not None:
                self.errors[reply.error] += 1
            if reply.kind in SERVED:
                self.served[op] += 1
                self.timeline.setdefault(worker, []).append((started, ended))
            elif reply.kind == UNTYPED:
                self.untyped.append(f"{op}: {reply.error}: {reply.detail}"[:300])
            elif reply.kind == UNEXPECTED:
                self.unexpected.append(f"{op}: {reply.error}: {reply.detail}"[:300])

    @property
    def http_500s(self) -> int:
        return sum(n for seen, n in self.errors.items() if seen.startswith("HTTP 5") and "503" not in seen)


@dataclass
class Report:
    phases: list[str]  # "name (mode, seconds)"
    threads: int
    seconds: float
    stats: Stats
    faults: list[FaultRecord]
    terminated: int
    samples: int
    sample_violations: list[str]
    invariants: dict[str, list[str]]
    drift: list[str]
    #: what group commit decided in the ``batching`` phases
    batches: BatchStats

    def violations(self) -> int:
        found = len(self.sample_violations) + len(self.drift)
        return found + sum(len(v) for v in self.invariants.values())

    def failures(self) -> list[str]:
        """Everything that must not happen, as text; empty for a clean run."""
        found = [f"untyped: {u}" for u in self.stats.untyped]
        found += [f"unexpected: {u}" for u in self.stats.unexpected]
        found += [f"limit exceeded: {v}" for v in self.sample_violations[:20]]
        found += [f"audit: {d}" for d in self.drift[:20]]
        for name, problems in self.invariants.items():
            found += [f"{name}: {p}" for p in problems[:20]]
        found += [
            f"no caller served again after {f.kind} in {f.phase}" for f in self.faults if f.recovery is None
        ]
        return found

    def table(self) -> str:
        s, b = self.stats, self.batches
        ops = sum(s.served.values())
        lines = [
            "| figure | value |",
            "| --- | --- |",
            f"| phases | {', '.join(self.phases)} |",
            f"| threads | {self.threads} |",
            f"| wall time | {self.seconds:.1f} s |",
            f"| operations served | {ops:,} ({_counts(s.served)}) |",
            f"| errors seen, by type | {_counts(s.errors) or 'none'} |",
            f"| untyped errors | {len(s.untyped)} |",
            f"| HTTP 500s | {s.http_500s} |",
            f"| unexpected typed errors | {len(s.unexpected)} |",
            f"| operations given up (in doubt) | {s.gave_up} |",
            f"| backends terminated | {self.terminated:,} |",
            f"| group commit (batching phases) | {b.requests:,} requests in {b.batches:,} transactions,"
            f" largest {b.largest}, {b.fallbacks} fallbacks |",
            f"| limit samples | {self.samples:,} |",
            f"| invariant violations | {self.violations()} |",
        ]
        for name, problems in [
            ("limit exceeded at a sample", self.sample_violations),
            ("audit drift", self.drift),
        ]:
            lines.append(f"| - {name} | {len(problems)} |")
        lines += [f"| - {name} | {len(problems)} |" for name, problems in self.invariants.items()]
        lines += [
            "",
            "| phase | fault | at (s) | restored after (s) | every caller served again after (s) |",
            "| --- | --- | --- | --- | --- |",
        ]
        for f in self.faults:
            recovery = "never" if f.recovery is None else f"{f.recovery:.2f}"
            lines.append(f"| {f.phase} | {f.kind} | {f.offset:.1f} | {f.restored - f.at:.2f} | {recovery} |")
        return "\n".join(lines)


def recovery(stats: Stats, fault: FaultRecord) -> float | None:
    """Seconds from the fault until the last caller of its phase finished a served call that it
    sent after the fault."""
    waits = []
    for worker, served in stats.timeline.items():
        if not worker.startswith(f"{fault.phase}-"):
            continue
        after = [ended for started, ended in served if started >= fault.at]
        if after:
            waits.append(min(after) - fault.at)
    return max(waits) if waits else None


def _counts(tally: Tally[str]) -> str:
    return ", ".join(f"{name} {count:,}" for name, count in sorted(tally.items()))
