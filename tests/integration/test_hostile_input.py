"""Property: every public mutating call, given hostile arguments, raises a QuotaLedgerError
subclass and leaves every ledger table byte-for-byte unchanged, on every backend.

Each example takes a valid call and spoils one of its arguments with a value that call must
refuse: NUL bytes, lone surrogates, control characters, huge or empty text, SQL-like and
non-ASCII names where the rules forbid them, wrong types, huge numbers, deep nesting, YAML
alias bombs and too many resources.
"""

from __future__ import annotations

import reprlib
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ledger_dump import dump
from sqlalchemy.engine import URL

from quota_ledger import QuotaEngine, QuotaLedgerError

EXAMPLES = 200

_POISON = st.sampled_from(["\x00", "\ud800", "\udfff", "\udc80", "\x01", "\x1b", "\x7f", "\u2028"])
_TEXT = st.text(max_size=12)
#: text holding at least one character no name may contain
TAINTED = st.builds(lambda a, p, b: a + p + b, _TEXT, _POISON, _TEXT)
HUGE_TEXT = st.integers(256, 5000).map(lambda n: "x" * n)
HUGE_INTS = st.one_of(st.integers(2**63, 2**200), st.integers(-(2**200), -1), st.just(10**400))
WRONG_TYPES = st.one_of(
    HUGE_INTS,
    st.integers(-5, 5),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.binary(max_size=4),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(_TEXT, st.integers(), max_size=2),
)
SQLISH = st.sampled_from(
    ["'; DROP TABLE reservations; --", "a b", "x' OR '1'='1", "ä", "名前", "😀", "../x", "%00"]
)
#: never a valid user, group, application, key or reservation id
BAD_NAME = st.one_of(TAINTED, HUGE_TEXT, st.just(""), WRONG_TYPES)
#: never a valid partition (YuniKorn's queue-name rule)
BAD_PARTITION = st.one_of(BAD_NAME, SQLISH, st.just("a" * 65), st.just("a.b"))
BAD_QUEUE = st.one_of(
    BAD_NAME,
    SQLISH.map(lambda s: f"root.{s}"),
    TAINTED.map(lambda s: f"root.{s}"),
    st.sampled_from(["root.", "root..a", "x.y", "root." + "a" * 65, "root." + ".".join(["a"] * 200)]),
)
BAD_QUANTITY = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    HUGE_INTS,
    TAINTED,
    st.sampled_from(["-1", "1e400", "abc", "1" * 200, "9223372036854775808", "1Qi", "--1", ""]),
    st.lists(st.integers(), max_size=2),
)
BAD_RESOURCES = st.one_of(
    st.builds(
        lambda name: {name: 1}, st.one_of(TAINTED, HUGE_TEXT, SQLISH, st.just(""), st.just("applications"))
    ),
    st.builds(lambda amount: {"vcore": amount}, BAD_QUANTITY),
    st.integers(65, 30_000).map(lambda n: {f"r{i}": 1 for i in range(n)}),
    st.one_of(st.lists(st.integers(), max_size=2), st.integers(), TAINTED),
)
BAD_GROUPS = st.one_of(
    st.lists(BAD_NAME, min_size=1, max_size=3),
    st.integers(),
    TAINTED,
    st.just(["g"] * 257),
    st.dictionaries(_TEXT, _TEXT, min_size=1, max_size=2),
)
BAD_TTL = st.one_of(
    st.booleans(), HUGE_INTS, st.floats(max_value=0), st.just(float("nan")), _TEXT, st.just(10**9)
)
BAD_FLAG = st.one_of(st.integers(), _TEXT, st.none(), st.lists(st.booleans(), max_size=1))


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother = 3, 60, 60


def _show(value: object) -> str:
    """A short description of an argument (deep and huge values included)."""
    return _REPR.repr(value)


def _nonempty(value: object) -> bool:
    return value not in ("", None)


def _deep(depth: int, leaf: Any = "x") -> Any:
    value = leaf
    for level in range(depth):
        value = {"a": value} if level % 2 else [value]
    return value


DEEP = st.integers(65, 3000).map(_deep)
DEEP_YAML = st.integers(65, 3000).map(lambda n: "a: " + "[" * n + "]" * n)
ALIAS_BOMB = st.integers(7, 9).map(
    lambda levels: "\n".join(
        ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
        + [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, levels)]
    )
)
#: a value to plant somewhere inside an otherwise valid document (free text may hold controls)
POISON_VALUE = st.one_of(
    st.builds(lambda a, p, b: a + p + b, _TEXT, st.sampled_from(["\x00", "\ud800", "\udfff"]), _TEXT), DEEP
)

VALID_CONFIG: dict[str, Any] = {"partitions": [{"name": "default", "queues": [{"name": "root"}]}]}


def _pod(**spoiled: Any) -> dict[str, Any]:
    meta = {"namespace": "team", "name": "p", "uid": "pod-uid"}
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}
    for path, value in spoiled.items():
        where, _, key = path.partition("__")
        (meta if where == "meta" else spec)[key] = value
    return {"metadata": meta, "spec": spec}


def _quota(**spoiled: Any) -> dict[str, Any]:
    quota: dict[str, Any] = {
        "kind": "ResourceQuota",
        "metadata": {"name": "q", "namespace": "team"},
        "spec": {"hard": {"pods": "5"}},
    }
    for key, value in spoiled.items():
        if key == "hard":
            quota["spec"]["hard"] = value
        else:
            quota["metadata"][key] = value
    return quota


@st.composite
def hostile_calls(draw: st.DrawFn, pending: str) -> tuple[str, Callable[[QuotaEngine], Any]]:
    """(description, call) of one public mutating call with one argument spoiled."""
    kind = draw(
        st.sampled_from(
            [
                "reserve",
                "release",
                "commit",
                "rollback",
                "release_reservation",
                "set_limits",
                "apply_config",
                "apply_namespace",
                "apply_resource_quota",
                "delete_resource_quota",
                "apply_admission_config",
                "reserve_pod",
                "release_pod",
                "audit",
            ]
        )
    )
    if kind in ("reserve", "release"):
        args: dict[str, Any] = {"queue": "root.a", "resources": {"vcore": 1}}
        spoilers = {
            "queue": BAD_QUEUE,
            "resources": BAD_RESOURCES,
            "partition": BAD_PARTITION,
            "user": BAD_NAME,
            "groups": BAD_GROUPS,
            "application": BAD_NAME,
        }
        if kind == "reserve":
            spoilers |= {
                "key": BAD_NAME,
                "ttl": BAD_TTL,
                "priority_class": st.one_of(BAD_NAME, st.sampled_from(["High", "a_b", "p" * 254])),
                "terminating": BAD_FLAG,
                "cross_namespace_affinity": BAD_FLAG,
            }
        else:
            spoilers["finished"] = BAD_FLAG
        field = draw(st.sampled_from(sorted(spoilers)))
        args[field] = draw(spoilers[field])
        queue, resources = args.pop("queue"), args.pop("resources")
        return f"{kind}({_show(queue)}, {_show(resources)}, {_show(args)})"[:300], lambda e: getattr(e, kind)(
            queue, resources, **args
        )
    if kind in ("commit", "rollback", "release_reservation"):
        if kind == "commit" and draw(st.booleans()):
            resources = draw(st.one_of(BAD_RESOURCES, st.just({"vcore": 5000}), st.just({"fpga": 1})))
            return f"commit(pending, {_show(resources)})"[:300], lambda e: e.commit(pending, resources)
        if kind == "release_reservation" and draw(st.booleans()):
            flag = draw(BAD_FLAG)
            return f"release_reservation(pending, finished={_show(flag)})", lambda e: e.release_reservation(
                pending, finished=flag
            )
        bad = draw(st.one_of(BAD_NAME, st.uuids().map(str)))
        return f"{kind}({_show(bad)})"[:300], lambda e: getattr(e, kind)(bad)
    if kind == "set_limits":
        field = draw(st.sampled_from(["queue", "resources", "partition"]))
        args = {"queue": "root.a", "resources": {"vcore": 4}, "partition": "default"}
        args[field] = draw(
            {
                "queue": BAD_QUEUE,
                "resources": st.one_of(BAD_RESOURCES.filter(lambda r: r != {"vcore": None})),
                "partition": BAD_PARTITION,
            }[field]
        )
        return f"set_limits({_show(args)})"[:300], lambda e: e.set_limits(**args)
    if kind == "apply_config":
        source = draw(
            st.one_of(
                DEEP_YAML,
                ALIAS_BOMB,
                DEEP.map(lambda d: {"partitions": [d]}),
                POISON_VALUE.map(
                    lambda v: {
                        "partitions": [
                            {"name": "default", "queues": [{"name": "root", "properties": {"a": v}}]}
                        ]
                    }
                ),
                WRONG_TYPES,
                TAINTED,
            )
        )
        return f"apply_config({_show(source)})"[:300], lambda e: e.apply_config(source)
    if kind == "apply_namespace":
        name = draw(st.one_of(BAD_NAME, SQLISH, st.sampled_from(["Team", "a.b", "a" * 64])))
        manifest = draw(
            st.one_of(
                st.just({"kind": "Namespace", "metadata": {"name": name}}),
                POISON_VALUE.map(lambda v: {"kind": "Namespace", "metadata": {"name": "team", "labels": v}}),
                DEEP_YAML,
                ALIAS_BOMB,
            )
        )
        return f"apply_namespace({_show(manifest)})"[:300], lambda e: e.apply_namespace(manifest)
    if kind == "apply_resource_quota":
        field = draw(st.sampled_from(["name", "namespace", "hard", "deep"]))
        if field == "deep":
            manifest: Any = draw(st.one_of(DEEP_YAML, ALIAS_BOMB, DEEP.map(lambda d: {**_quota(), "x": d})))
        elif field == "hard":
            manifest = _quota(
                hard=draw(BAD_RESOURCES.filter(lambda r: isinstance(r, dict) and "pods" not in r))
            )
        else:
            manifest = _quota(**{field: draw(st.one_of(BAD_NAME, SQLISH, st.just("A")))})
        return f"apply_resource_quota({_show(manifest)})"[:300], lambda e: e.apply_resource_quota(manifest)
    if kind == "delete_resource_quota":
        namespace = draw(st.one_of(BAD_NAME, SQLISH, st.just("team")))
        name = draw(st.one_of(BAD_NAME, SQLISH, st.just("absent")))
        return f"delete_resource_quota({_show(namespace)}, {_show(name)})", lambda e: e.delete_resource_quota(
            namespace, name
        )
    if kind == "apply_admission_config":
        manifest = draw(
            st.one_of(
                WRONG_TYPES.filter(lambda v: v is not None and v != []).map(
                    lambda v: {"kind": "AdmissionConfiguration", "plugins": v}
                ),
                st.just({"kind": "AdmissionConfiguration", "plugins": None}),
                st.just({"kind": "AdmissionConfiguration", "plugins": "x"}),
                POISON_VALUE.map(
                    lambda v: {"kind": "ResourceQuotaConfiguration", "limitedResources": [{"x": v}]}
                ),
                DEEP_YAML,
                ALIAS_BOMB,
                TAINTED,
            )
        )
        return f"apply_admission_config({_show(manifest)})"[:300], lambda e: e.apply_admission_config(
            manifest
        )
    if kind in ("reserve_pod", "release_pod"):
        pod = draw(
            st.one_of(
                BAD_NAME.map(lambda v: _pod(meta__namespace=v) if v else _pod(meta__namespace="Team")),
                st.one_of(BAD_NAME, SQLISH).filter(_nonempty).map(lambda v: _pod(meta__name=v)),
                st.one_of(BAD_NAME, st.just("High"), st.just("p" * 300))
                .filter(_nonempty)
                .map(lambda v: _pod(spec__priorityClassName=v)),
                POISON_VALUE.map(lambda v: _pod(meta__annotations={"a": v})),
                BAD_RESOURCES.map(lambda r: _pod(spec__overhead=r)),
                DEEP_YAML,
                ALIAS_BOMB,
                WRONG_TYPES,
            )
        )
        return f"{kind}({_show(pod)})"[:300], lambda e: getattr(e, kind)(pod)
    partition = draw(BAD_PARTITION)
    return f"audit(fix=True, partition={_show(partition)})"[:300], lambda e: e.audit(
        fix=True, partition=partition
    )


def test_hostile_arguments_raise_typed_errors_and_change_nothing(db_url: URL) -> None:
    with QuotaEngine.from_url(db_url) as engine:
        engine.set_limits("root.a", {"vcore": 8})
        engine.apply_resource_quota(_quota())
        pending = engine.reserve(
            "root.a", {"vcore": 1}, key="k", user="alice", groups=["g"], application="app"
        )
        engine.reserve_pod(_pod(), key="held")
        before = dump(engine)

        @given(hostile_calls(pending.id))
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def check(case: tuple[str, Callable[[QuotaEngine], Any]]) -> None:
            description, call = case
            try:
                call(engine)
            except QuotaLedgerError:
                pass
            else:
                raise AssertionError(f"accepted: {description}")
            assert dump(engine) == before, description

        check()
