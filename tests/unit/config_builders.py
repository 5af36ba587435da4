"""Configurations for the configuration tests, built from short calls, and what validation says of them.

``refused`` checks a refusal for its partition, full queue path, limit and message (the ledger's own
words, quantities as a person writes them).
"""

from __future__ import annotations

from typing import Any

from quota_ledger.config import load, validate
from quota_ledger.model.values import ConfigProblem

#: how every refused amount begins, before the list of suffixes
AMOUNT = "is not a valid amount: write a whole number with no sign or decimals, optionally followed by one of"

# -- builders ---------------------------------------------------------------------------------------


def q(name: str, *children: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """A queue: ``q("a", q("b"), maxapplications=3)``."""
    queue: dict[str, Any] = {"name": name, **fields}
    if children:
        queue["queues"] = list(children)
    return queue


def lim(*, users: list[str] | None = None, groups: list[str] | None = None, **fields: Any) -> dict[str, Any]:
    """A limit; without maxresources or maxapplications it gets ``maxapplications: 1``."""
    limit: dict[str, Any] = dict(fields)
    if users is not None:
        limit["users"] = users
    if groups is not None:
        limit["groups"] = groups
    if "maxresources" not in limit and "maxapplications" not in limit:
        limit["maxapplications"] = 1
    return limit


def doc(*children: dict[str, Any], **root: Any) -> dict[str, Any]:
    """One partition ``default`` whose root holds ``children``."""
    return {"partitions": [{"name": "default", "queues": [q("root", *children, **root)]}]}


def problems(source: Any) -> list[ConfigProblem]:
    return validate(load(source))


def accepted(source: Any) -> None:
    assert problems(source) == []


def refused(
    source: Any, message: str, *, queue: str = "", limit: str = "", partition: str = "default"
) -> ConfigProblem:
    """The one problem whose message contains ``message``; checks where it was found."""
    found = problems(source)
    matching = [p for p in found if message in p.message]
    assert len(matching) == 1, found
    problem = matching[0]
    assert (problem.partition, problem.queue, problem.limit) == (partition, queue, limit), problem
    return problem


# -- a configuration that sets every kind of field -------------------------------------------------

YAML = """
partitions:
  - name: default
    placementrules:
      - name: tag
        value: namespace
        create: true
    queues:
      - name: root
        submitacl: '*'
        limits:
          - limit: everyone
            users: ["*"]
            maxresources: {memory: 100G, vcore: 10}
        queues:
          - name: a
            maxapplications: 4
            resources:
              guaranteed: {memory: 10G}
              max: {memory: 50G, vcore: 5}
            properties: {application.sort.policy: fifo, priority.offset: 10}
"""


# -- queue resources, limits of one queue, memory limits -------------------------------------------


def res(guaranteed: dict[str, Any] | None = None, maximum: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if guaranteed is not None:
        out["guaranteed"] = guaranteed
    if maximum is not None:
        out["max"] = maximum
    return out


def in_a(*limits: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """A document whose queue ``root.a`` has ``limits``."""
    return doc(q("a", limits=list(limits), **fields))


def mem(kind: str, names: list[str], memory: int, label: str = "") -> dict[str, Any]:
    """A limit of ``memory`` bytes for ``names`` (``kind`` is ``users`` or ``groups``)."""
    limit = lim(**{kind: names}, maxresources={"memory": memory})
    return {**limit, "limit": label} if label else limit
