"""Names no configuration knows: a resource limited nowhere in the partition, or a queue outside
every configured subtree. Either is how a typo (``gpus`` for ``nvidia.com/gpu``, ``root.nope``
for ``root.dev``) silently creates a counter that no limit checks. A reservation naming one is
warned about (:func:`in_request`); a limit set naming one close to a known name, which is how a
typo looks there, too (:func:`in_limits`); a partition with ``unknownnames: refuse`` refuses
both instead (:meth:`Unknown.refusal`). Pure: it reads compiled rules, and the closest names
come from :mod:`difflib`."""

from __future__ import annotations

import difflib
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from quota_ledger.config.rules import PartitionRules
from quota_ledger.model.errors import InvalidRequest, UnknownQueue, UnknownResource
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


def known(rules: PartitionRules) -> tuple[frozenset[str], frozenset[str]]:
    """(the resources some limit of the partition names, its configured queues)."""
    return _known(rules)


def closest(name: str, candidates: Iterable[str]) -> str | None:
    """The candidate closest to ``name`` (:mod:`difflib`), if any is close."""
    close = difflib.get_close_matches(name, sorted(candidates), n=1, cutoff=0.5)
    if not close:  # `gpus` and `nvidia.com/gpu`: compare with the name's last part too
        tails = {c.rsplit("/", 1)[-1]: c for c in candidates}
        match = difflib.get_close_matches(name, sorted(tails), n=1, cutoff=0.6)
        close = [tails[match[0]]] if match else []
    return close[0] if close else None


def _suggest(name: str | None) -> str:
    return f"; did you mean `{name}`?" if name else ""


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


@dataclass(frozen=True, slots=True)
class Unknown:
    """What a request names that the partition's configuration does not know."""

    partition: str
    #: the request's queue, when it lies outside every configured queue but root
    queue: str | None = None
    #: the closest configured queue to it, if any is close
    queue_suggestion: str | None = None
    #: each resource no limit of the partition names -> the closest limited one, if any
    resources: Mapping[str, str | None] = field(default_factory=dict)
    #: the words of the queue's warning (a limit makes the queue; a reservation uses it)
    queue_words: str = "is a new queue with no limits"

    def warnings(self) -> tuple[str, ...]:
        """One line per unknown name, the queue's first: () when all is known."""
        found = [
            f"`{res}` is not limited anywhere in partition {self.partition}{_suggest(close)}"
            for res, close in self.resources.items()
        ]
        if self.queue is not None:
            found.insert(0, f"`{self.queue}` {self.queue_words}{_suggest(self.queue_suggestion)}")
        return tuple(found)

    def refusal(self) -> InvalidRequest | None:
        """The error a partition that refuses unknown names raises (None: all is known)."""
        said = self.warnings()
        if self.queue is not None:
            return UnknownQueue(self.partition, self.queue, self.queue_suggestion, said[0])
        if self.resources:
            suggestions = {res: close for res, close in self.resources.items() if close}
            return UnknownResource(self.partition, list(self.resources), suggestions, "; ".join(said))
        return None


def in_request(rules: PartitionRules, queue: str, resources: Iterable[str]) -> Unknown:
    """What a reservation of ``resources`` in ``queue`` names that no configuration knows."""
    limited, queues = _known(rules)
    unknown = {res: closest(res, limited) for res in unknown_resources(rules, resources)}
    if not unknown_queue(rules, queue):
        return Unknown(rules.name, resources=unknown)
    return Unknown(rules.name, queue, closest(queue, queues - {"root"}), unknown)


def in_limits(rules: PartitionRules, queue: str, limits: Mapping[str, int | None]) -> Unknown:
    """What setting ``limits`` on ``queue`` names that looks like a typo of a known name: a
    resource no limit names yet that is close to one that is, a queue outside every configured
    one close to a configured sibling. A name close to none is a new one, meant as such."""
    limited, queues = _known(rules)
    setting = [res for res, value in limits.items() if value is not None]
    unknown = {res: close for res in unknown_resources(rules, setting) if (close := closest(res, limited))}
    if not unknown_queue(rules, queue):
        return Unknown(rules.name, resources=unknown)
    parent, _, name = queue.rpartition(".")
    siblings = {q.rpartition(".")[2]: q for q in queues if q.rpartition(".")[0] == parent}
    match = difflib.get_close_matches(name, sorted(siblings), n=1, cutoff=0.6)
    if not match:
        return Unknown(rules.name, resources=unknown)
    return Unknown(rules.name, queue, siblings[match[0]], unknown, queue_words="is a new queue")


def warnings(rules: PartitionRules, queue: str, resources: Iterable[str]) -> tuple[str, ...]:
    """Every warning for a request naming ``resources`` in ``queue``: () when all is known."""
    return in_request(rules, queue, resources).warnings()
