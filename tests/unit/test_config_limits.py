"""User and group limits, notes §1.4.1 and §1.4.2: the rules within one queue (names, wildcards,
repeated names, amounts against the queue's own settings) and down the hierarchy (no limit above
the limit for the same name, or the wildcard, on a parent queue).

Each rule has a configuration YuniKorn accepts and one it refuses; a refusal is checked for
its partition, full queue path, limit and message.
"""

from __future__ import annotations

import pytest
from config_builders import AMOUNT, accepted, doc, in_a, lim, mem, problems, q, refused, res

from quota_ledger.config.amounts import SUFFIXES
from quota_ledger.config.user_group_checks import ONLY_WILDCARD_GROUP

# -- 1.4.1: limits within one queue ----------------------------------------------------------------


def test_a_limit_without_users_or_groups_is_refused() -> None:
    refused(
        in_a(lim(limit="nobody", users=[], maxresources={"memory": "10"}, maxapplications=2)),
        "the limit names no user and no group",
        queue="root.a",
        limit="nobody",
    )
    accepted(in_a(lim(users=["sue"]), lim(groups=["dev"])))


@pytest.mark.parametrize(
    "name", ["sue", "_x", "sue@example.com", "bob$", "dom/user", "a:b#c", "first.last", "s-1"]
)
def test_valid_user_names_are_accepted(name: str) -> None:
    accepted(in_a(lim(users=[name])))


@pytest.mark.parametrize("name", ["1sue", "sue bob", "", "-x", "a$b", "sue*", "**"])
def test_invalid_user_names_are_refused(name: str) -> None:
    refused(
        in_a(lim(users=[name])),
        f"user name '{name}' is not valid: it must start with a letter or '_'",
        queue="root.a",
        limit=name,
    )


@pytest.mark.parametrize("name", ["dev", "_g", "dev.ops", "a:b", "team-1"])
def test_valid_group_names_are_accepted(name: str) -> None:
    accepted(in_a(lim(groups=[name])))


@pytest.mark.parametrize("name", ["dev@x", "dev$", "1dev", "a/b", "a#b", ""])
def test_invalid_group_names_are_refused(name: str) -> None:
    refused(
        in_a(lim(limit="g", groups=[name])),
        f"group name '{name}' is not valid: it must start with a letter or '_'",
        queue="root.a",
        limit="g",
    )


def test_a_user_named_twice_in_a_queue_is_refused() -> None:
    refused(
        in_a(lim(users=["sue", "sue"])),
        "user 'sue' is named by more than one limit of this queue",
        queue="root.a",
        limit="sue",
    )
    refused(
        in_a(lim(users=["sue"]), lim(limit="again", users=["sue"])),
        "user 'sue' is named by more than one limit of this queue",
        queue="root.a",
        limit="again",
    )
    refused(
        in_a(lim(users=["*"]), lim(users=["*"])),
        "user '*' is named by more than one limit of this queue",
        queue="root.a",
        limit="*",
    )


def test_a_group_named_twice_in_a_queue_is_refused() -> None:
    refused(
        in_a(lim(groups=["dev"]), lim(groups=["dev"])),
        "group 'dev' is named by more than one limit of this queue",
        queue="root.a",
        limit="dev",
    )


def test_the_same_user_in_different_queues_is_accepted() -> None:
    accepted(
        doc(
            q("a", limits=[lim(users=["sue"])]),
            q("b", limits=[lim(users=["sue"])]),
            limits=[lim(users=["sue"])],
        )
    )


def test_a_named_user_after_the_wildcard_is_refused() -> None:
    message = (
        "user 'sue' comes after the user wildcard '*': "
        "the wildcard must be the last user of the queue's limits"
    )
    refused(in_a(lim(users=["*", "sue"])), message, queue="root.a", limit="sue")
    refused(in_a(lim(users=["*"]), lim(limit="late", users=["sue"])), message, queue="root.a", limit="late")


def test_the_user_wildcard_may_share_a_list_when_it_comes_last() -> None:
    accepted(in_a(lim(users=["sue", "bob", "*"])))
    accepted(in_a(lim(users=["sue"]), lim(users=["*"])))


def test_a_named_group_after_the_wildcard_is_refused() -> None:
    refused(
        in_a(lim(groups=["dev", "*", "ops"])),
        "group 'ops' comes after the group wildcard '*'",
        queue="root.a",
        limit="ops",
    )


def test_a_lone_group_wildcard_is_refused() -> None:
    problem = refused(
        in_a(lim(limit="all", groups=["*"])),
        "the only group limit is the wildcard '*'",
        queue="root.a",
        limit="all",
    )
    assert problem.message.endswith("needs at least one limit that names a group")


def test_a_group_wildcard_before_its_named_group_is_refused_twice() -> None:
    found = problems(in_a(lim(groups=["*"]), lim(groups=["dev"])))
    assert [p.message for p in found] == [
        ONLY_WILDCARD_GROUP,
        "group 'dev' comes after the group wildcard '*': "
        "the wildcard must be the last group of the queue's limits",
    ]


def test_a_group_wildcard_after_a_named_group_is_accepted() -> None:
    accepted(in_a(lim(groups=["dev"]), lim(groups=["*"])))
    accepted(in_a(lim(groups=["dev", "*"])))


def test_all_zero_maxresources_is_refused_but_a_partial_zero_is_accepted() -> None:
    refused(
        in_a(lim(limit="z", users=["sue"], maxresources={"memory": 0, "vcore": "0"})),
        "maxresources must have at least one amount above zero and none below",
        queue="root.a",
        limit="z",
    )
    accepted(in_a(lim(users=["sue"], maxresources={"memory": 100, "vcore": 0})))


def test_a_limit_that_limits_nothing_is_refused() -> None:
    refused(
        in_a({"limit": "none", "users": ["sue"], "maxapplications": 0}),
        "the limit sets neither maxresources nor maxapplications",
        queue="root.a",
        limit="none",
    )
    accepted(in_a(lim(users=["sue"], maxapplications=0, maxresources={"memory": 1})))


def test_a_limit_maxapplications_above_the_queue_is_refused() -> None:
    refused(
        in_a(lim(limit="apps", users=["sue"], maxapplications=6), maxapplications=5),
        "maxapplications 6 is more than the queue's maxapplications 5",
        queue="root.a",
        limit="apps",
    )
    accepted(in_a(lim(users=["sue"], maxapplications=5), maxapplications=5))
    accepted(in_a(lim(users=["sue"], maxapplications=500)))


def test_limit_resources_above_the_queue_max_are_refused() -> None:
    refused(
        in_a(
            lim(limit="big", users=["sue"], maxresources={"memory": 200}),
            resources=res(None, {"memory": 100}),
        ),
        "maxresources (memory 200) is more than the queue's max (memory 100)",
        queue="root.a",
        limit="big",
    )


def test_limit_resources_of_types_the_queue_max_lacks_are_accepted() -> None:
    accepted(
        in_a(
            lim(users=["sue"], maxresources={"memory": 100, "vcore": 99}),
            resources=res(None, {"memory": 100}),
        )
    )
    accepted(in_a(lim(users=["sue"], maxresources={"memory": 10**12})))


def test_a_limit_quantity_that_does_not_parse_is_reported_alone() -> None:
    found = problems(in_a(lim(limit="bad", users=["sue"], maxresources={"memory": "10x"}, maxapplications=0)))
    assert [(p.queue, p.limit, p.message) for p in found] == [
        (
            "root.a",
            "bad",
            f"memory: '10x' {AMOUNT} {SUFFIXES}",
        )
    ]
    refused(
        in_a(lim(users=["sue"], maxresources={"applications": 3})),
        "counted by the ledger itself",
        queue="root.a",
        limit="sue",
    )


def test_a_limit_without_description_is_named_by_its_names() -> None:
    problem = refused(
        in_a({"users": ["sue"], "groups": ["dev"]}),
        "sets neither maxresources nor maxapplications",
        queue="root.a",
        limit="sue,dev",
    )
    assert problem.message == "the limit sets neither maxresources nor maxapplications"


# -- 1.4.2: limits down the hierarchy -------------------------------------------------------------


@pytest.mark.parametrize("kind", ["users", "groups"])
def test_a_limit_above_the_same_name_further_up_is_refused(kind: str) -> None:
    name, word = ("sue", "user") if kind == "users" else ("dev", "group")
    refused(
        doc(q("a", limits=[mem(kind, [name], 150)]), limits=[mem(kind, [name], 100)]),
        f"maxresources of {word} '{name}' (memory 150) is more than the limit for '{name}' on a parent queue "
        "(memory 100)",
        queue="root.a",
        limit=name,
    )
    accepted(doc(q("a", limits=[mem(kind, [name], 100)]), limits=[mem(kind, [name], 100)]))


def test_a_limit_above_the_ancestor_user_wildcard_is_refused() -> None:
    refused(
        doc(q("p", q("c", limits=[mem("users", ["sue"], 150, "mine")])), limits=[mem("users", ["*"], 100)]),
        "maxresources of user 'sue' (memory 150) is more than the user wildcard's limit on a parent queue "
        "(memory 100)",
        queue="root.p.c",
        limit="mine",
    )
    accepted(doc(q("p", q("c", limits=[mem("users", ["sue"], 50)])), limits=[mem("users", ["*"], 100)]))


def test_a_group_limit_above_the_ancestor_group_wildcard_is_refused() -> None:
    refused(
        doc(q("a", limits=[mem("groups", ["ops"], 150)]), limits=[mem("groups", ["dev", "*"], 100)]),
        "maxresources of group 'ops' (memory 150) is more than the group wildcard's limit on a parent queue",
        queue="root.a",
        limit="ops",
    )


def test_ancestor_limits_carry_through_queues_without_limits() -> None:
    refused(
        doc(q("a", q("b", q("c", limits=[mem("users", ["sue"], 150)]))), limits=[mem("users", ["sue"], 100)]),
        "maxresources of user 'sue' (memory 150) is more than the limit for 'sue' on a parent queue",
        queue="root.a.b.c",
        limit="sue",
    )


def test_ancestor_limits_carry_through_queues_limiting_other_names() -> None:
    source = doc(
        q("a", q("b", limits=[mem("users", ["sue"], 150)]), limits=[mem("users", ["bob"], 10)]),
        limits=[mem("users", ["sue"], 100)],
    )
    refused(source, "maxresources of user 'sue' (memory 150)", queue="root.a.b", limit="sue")


def test_the_smallest_ancestor_value_is_carried_down() -> None:
    source = doc(
        q(
            "a",
            q("b", limits=[mem("users", ["sue"], 80)]),
            limits=[lim(users=["sue"], maxresources={"memory": 100, "vcore": 1})],
        ),
        limits=[lim(users=["sue"], maxresources={"memory": 50})],
    )
    refused(
        source,
        "maxresources of user 'sue' (memory 80) is more than the limit for 'sue' on a parent queue "
        "(memory 50, vcore 1)",
        queue="root.a.b",
        limit="sue",
    )


def test_siblings_are_independent() -> None:
    accepted(
        doc(
            q(
                "a",
                q("x", limits=[mem("users", ["sue"], 100)]),
                q("y", limits=[mem("users", ["sue"], 100)]),
                limits=[mem("users", ["sue"], 100)],
            ),
            q("b", limits=[mem("users", ["sue"], 1000)]),
        )
    )


def test_types_the_ancestor_does_not_limit_pass() -> None:
    accepted(
        doc(
            q("a", limits=[lim(users=["sue"], maxresources={"vcore": 10})]),
            limits=[mem("users", ["sue"], 100)],
        )
    )


@pytest.mark.parametrize(("kind", "word"), [("users", "user"), ("groups", "group")])
def test_maxapplications_above_the_same_name_further_up_is_refused(kind: str, word: str) -> None:
    refused(
        doc(
            q("a", limits=[lim(**{kind: ["x"]}, maxapplications=10)]),
            limits=[lim(**{kind: ["x"]}, maxapplications=5)],
        ),
        f"maxapplications of {word} 'x' (10) is more than the limit for 'x' on a parent queue (5)",
        queue="root.a",
        limit="x",
    )
    accepted(
        doc(
            q("a", limits=[lim(**{kind: ["x"]}, maxapplications=5)]),
            limits=[lim(**{kind: ["x"]}, maxapplications=5)],
        )
    )


def test_maxapplications_above_the_ancestor_wildcard_is_refused() -> None:
    refused(
        doc(
            q("a", q("b", limits=[lim(users=["sue"], maxapplications=10)])),
            limits=[lim(users=["*"], maxapplications=5)],
        ),
        "maxapplications of user 'sue' (10) is more than the user wildcard's limit on a parent queue (5)",
        queue="root.a.b",
        limit="sue",
    )
    accepted(
        doc(
            q("a", q("b", limits=[lim(users=["sue"], maxapplications=2)])),
            limits=[lim(users=["*"], maxapplications=5)],
        )
    )


def test_a_child_limit_with_only_maxresources_under_an_ancestor_maxapplications_is_refused() -> None:
    refused(
        doc(q("a", limits=[mem("users", ["sue"], 10)]), limits=[lim(users=["sue"], maxapplications=5)]),
        "maxapplications of user 'sue' (unlimited (0)) is more than "
        "the limit for 'sue' on a parent queue (5)",
        queue="root.a",
        limit="sue",
    )
    accepted(doc(q("a", limits=[lim(users=["sue"], maxapplications=50)]), limits=[mem("users", ["sue"], 10)]))


def test_maxapplications_carry_through_queues_without_limits_and_siblings_are_independent() -> None:
    refused(
        doc(
            q("a", q("b", limits=[lim(groups=["dev"], maxapplications=9)])),
            limits=[lim(groups=["dev"], maxapplications=3)],
        ),
        "maxapplications of group 'dev' (9)",
        queue="root.a.b",
        limit="dev",
    )
    accepted(
        doc(
            q("a", limits=[lim(groups=["dev"], maxapplications=3)]),
            q("b", limits=[lim(groups=["dev"], maxapplications=3)]),
            limits=[lim(groups=["dev"], maxapplications=3)],
        )
    )
