"""Who holds what a limit counts: the largest holders named beside a refusal.

For a limit that stops a request (a :class:`Violation`), the holders of what it counts in its
resource, the largest first (in use plus reserved), at most :data:`TOP`:

- a queue's limit counts its subtree: its running applications (their rows in
  ``quota_applications``), each user's reservations that name no application (the user's
  bucket row), and what the queues' own counters hold beyond those (reservations of no user and
  no application, named by their queue);
- a user's or a group's limit counts the applications of that user, or tracked against that
  group, in the limit's subtree;
- a ResourceQuota counts the pods of its namespace's queue that it matches: the holders of that
  queue, as for a queue's limit (its applications and untracked reservations).

``applications`` (a ``maxapplications`` limit) is held one each by the running applications,
the oldest first. Read in the transaction that decided, so the holders are those the decision saw.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from quota_ledger.driver.tx import LedgerTx
from quota_ledger.model.counters import QUEUE
from quota_ledger.model.quantity import APPLICATIONS
from quota_ledger.model.queues import in_subtree
from quota_ledger.model.tracking import RUNNING, AppState
from quota_ledger.model.values import Blocker, Holder, HolderKind, Violation

#: how many holders a blocker names
TOP = 5


def blockers(tx: LedgerTx, queue: str, violations: Sequence[Violation]) -> tuple[Blocker, ...]:
    """A blocker for each of ``violations`` of a request to ``queue``, with its holders."""
    if not violations:
        return ()
    partition = violations[0].partition
    apps = [a for a in tx.read_apps(partition) if a.state == RUNNING]
    found = []
    for violation in violations:
        scope = queue if violation.kind == "quota" else violation.scope
        mine = [a for a in apps if in_subtree(a.queue, scope) and _counted(a, violation)]
        if violation.resource == APPLICATIONS:
            named = sorted((a for a in mine if a.counts), key=lambda a: (a.submitted_at, a.app_key))
            held = [_holder(a, 1, 0) for a in named]
        else:
            held = [_holder(a, *_usage(a, violation.resource)) for a in mine]
            if violation.kind in ("queue", "quota"):
                held += _untracked(tx, partition, scope, violation.resource, mine)
        held = [h for h in held if h.held > 0]
        if violation.resource != APPLICATIONS:
            held.sort(key=lambda h: (-h.held, h.kind, h.name))
        found.append(Blocker(violation=violation, holders=tuple(held[:TOP])))
    return tuple(found)


def _counted(app: AppState, violation: Violation) -> bool:
    """Whether ``violation``'s limit counts ``app``."""
    if violation.kind == "user":
        return app.user == violation.name
    if violation.kind == "group":
        return app.group == violation.name
    return True


def _usage(app: AppState, resource: str) -> tuple[int, int]:
    in_use, reserved = app.usage.get(resource, (0, 0))
    return in_use, reserved


def _holder(app: AppState, in_use: int, reserved: int) -> Holder:
    if app.application is not None:
        return Holder(
            kind=HolderKind.APPLICATION,
            name=app.application,
            queue=app.queue,
            in_use=in_use,
            reserved=reserved,
        )
    return Holder(
        kind=HolderKind.USER, name=app.user or "", queue=app.queue, in_use=in_use, reserved=reserved
    )


def _untracked(
    tx: LedgerTx, partition: str, scope: str, resource: str, apps: Iterable[AppState]
) -> list[Holder]:
    """What the queues of ``scope``'s subtree hold beyond their applications' rows, by queue."""
    tracked: dict[str, tuple[int, int]] = {}
    for app in apps:
        in_use, reserved = _usage(app, resource)
        was = tracked.get(app.queue, (0, 0))
        tracked[app.queue] = (was[0] + in_use, was[1] + reserved)
    found = []
    for counter in tx.usage_rows(partition, scope):
        if (
            counter.scope_type != QUEUE
            or counter.resource != resource
            or not in_subtree(counter.scope, scope)
        ):
            continue
        in_use, reserved = tracked.get(counter.scope, (0, 0))
        left = (counter.in_use - in_use, counter.reserved - reserved)
        if left[0] > 0 or left[1] > 0:
            found.append(
                Holder(
                    kind=HolderKind.QUEUE,
                    name=counter.scope,
                    queue=counter.scope,
                    in_use=max(left[0], 0),
                    reserved=max(left[1], 0),
                )
            )
    return found
