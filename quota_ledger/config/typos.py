"""Warnings for a request that names what no configuration knows: a resource limited nowhere in
the partition, or a queue outside every configured subtree. Either is how a typo (``gpus`` for
``nvidia.com/gpu``, ``root.nope`` for ``root.dev``) silently creates a counter that no limit
checks. Pure: it reads compiled rules, and the closest names come from :mod:`difflib`."""

from __future__ import annotations

import difflib
import threading
from collections.abc import Iterable

from quota_ledger.config.rules import PartitionRules
from quota_ledger.model.quantity import APPLICATIONS

#: id(rules) -> (rules, resources limited anywhere, configured queues): one entry per version
#: seen, so a reservation pays set lookups only. The rules are kept so that an id is never reused.
_KNOWN: dict[int, tuple[PartitionRules, frozenset[str], frozenset[str]]] = {}
_LOCK = threading.Lock()
_KEPT = 16


def _known(rules: PartitionRules) -> tuple[frozenset[str], frozenset[str]]:
    found = _KNOWN.get(id(rules))
    if found is not None and found[0] is rules:
        return found[1], found[2]
    limited: set[str] = set(rules.capacity)
    for rule in rules.queues.values():
        limited.update(rule.max)
        for identity in (*rule.users.values(), *rule.groups.values()):
            limited.update(identity.resources)
    for quotas in rules.quotas.values():
        for quota in quotas:
            limited.update(quota.hard)
            scoped = (n for n in quota.hard if n.startswith(("requests.", "limits.")))
            limited.update(name.split(".", 1)[1] for name in scoped)
    limited.discard(APPLICATIONS)
    queues = frozenset(rules.queues)
    with _LOCK:
        if len(_KNOWN) >= _KEPT:
            _KNOWN.clear()
        _KNOWN[id(rules)] = (rules, frozenset(limited), queues)
    return frozenset(limited), queues


def _suggest(name: str, candidates: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, sorted(candidates), n=1, cutoff=0.5)
    if not close:  # `gpus` and `nvidia.com/gpu`: compare with the name's last part too
        tails = {c.rsplit("/", 1)[-1]: c for c in candidates}
        match = difflib.get_close_matches(name, sorted(tails), n=1, cutoff=0.6)
        close = [tails[match[0]]] if match else []
    return f"; did you mean `{close[0]}`?" if close else ""


def unknown_resources(rules: PartitionRules, resources: Iterable[str]) -> list[str]:
    """The resources of ``resources`` that no limit of the partition names (none when the
    partition limits nothing at all: then nothing is a typo of anything)."""
    limited, _queues = _known(rules)
    if not limited:
        return []
    return [res for res in resources if res not in limited and res != APPLICATIONS]


def unknown_queue(rules: PartitionRules, queue: str) -> bool:
    """Whether ``queue`` lies outside every configured queue but root: a new queue that only
    root's limits cover (none when the partition configures no queue below root)."""
    _limited, queues = _known(rules)
    if queue in queues or len(queues) <= 1:
        return False
    parts = queue.split(".")
    return not any(".".join(parts[:n]) in queues for n in range(2, len(parts)))


def resource_warning(rules: PartitionRules, resource: str) -> str:
    limited, _queues = _known(rules)
    return f"`{resource}` is not limited anywhere in partition {rules.name}{_suggest(resource, limited)}"


def queue_warning(rules: PartitionRules, queue: str) -> str:
    _limited, queues = _known(rules)
    return f"`{queue}` is a new queue with no limits{_suggest(queue, queues - {'root'})}"


def warnings(rules: PartitionRules, queue: str, resources: Iterable[str]) -> tuple[str, ...]:
    """Every warning for a request naming ``resources`` in ``queue``: () when all is known."""
    found = [resource_warning(rules, res) for res in unknown_resources(rules, resources)]
    if unknown_queue(rules, queue):
        found.insert(0, queue_warning(rules, queue))
    return tuple(found)
