"""How validation reports problems: every independent problem, each once, where it was found,
with the closest known key suggested for a misspelt one."""

from __future__ import annotations

from config_builders import AMOUNT, doc, lim, problems, q, res

from quota_ledger.config.amounts import SUFFIXES
from quota_ledger.ledger import configure

# -- everything is reported ---------------------------------------------------------------------------


def test_independent_problems_are_all_reported() -> None:
    source = {
        "partitions": [
            {
                "queues": [
                    q("a", adminacl="a b c"),
                    q("b", resources=res({"memory": 2}, {"memory": 1})),
                    q("c", limits=[lim(users=["1bad"])]),
                ]
            },
            {"name": "gpu"},
        ]
    }
    found = problems(source)
    assert [(p.partition, p.queue, p.limit) for p in found] == [
        ("default", "root.a", ""),
        ("default", "root.c", "1bad"),
        ("default", "root.b", ""),
        ("gpu", "", ""),
    ]


def test_three_independent_problems_give_three() -> None:
    source = doc(
        q("a", q("x"), maxapplications=2),
        q("b", limits=[lim(users=["sue", "sue"])]),
        q("c", resources=res(None, {"memory": "1m"})),
    )
    assert len(problems(source)) == 3


# -- what an operator reads ---------------------------------------------------------------------------


def test_an_unknown_key_suggests_the_closest_and_does_not_hide_other_problems() -> None:
    source = doc(q("a", maxapplication=3, resources=res(None, {"memory": "1.5G"})))
    _, found = configure.check(source)
    assert [(p.queue, p.message) for p in found] == [
        ("root.a", "partitions.0.queues.0.queues.0.maxapplication: unknown key 'maxapplication' "
         "(did you mean 'maxapplications'?)"),
        ("root.a", f"memory: '1.5G' {AMOUNT} {SUFFIXES}"),
    ]  # fmt: skip


def test_an_unknown_key_far_from_every_known_one_suggests_nothing() -> None:
    _, found = configure.check(doc(q("a", zzzz=1)))
    assert [p.message for p in found] == ["partitions.0.queues.0.queues.0.zzzz: unknown key 'zzzz'"]


def test_every_problem_is_reported_once() -> None:
    twice = lim(limit="same", users=["1bad"])
    _, found = configure.check(doc(q("a", limits=[twice]), q("b", limits=[twice])))
    assert len(found) == len(set(found)) == 2
