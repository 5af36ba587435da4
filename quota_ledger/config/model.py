"""YuniKorn's queue configuration as frozen pydantic models: load, normalize, dump.

Field names are YuniKorn's YAML keys (all lowercase). Parsing is strict as YuniKorn's is
(``yaml.UnmarshalStrict``): an unknown key, a duplicate key or a value of the wrong type
refuses the whole document. Whether the configuration makes sense is
:func:`quota_ledger.config.validate.validate`'s business, not this module's.
"""

from __future__ import annotations

import copy
import difflib
import os
from collections.abc import Mapping
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import ErrorDetails

from quota_ledger.model.errors import ConfigError
from quota_ledger.model.values import ConfigProblem

ROOT = "root"
DEFAULT_PARTITION = "default"
#: the queue property that names what owns a queue's limits (``keystone``): a local
#: ``set_limits`` on that queue or below it is refused with :class:`ManagedQueue`
MANAGED_BY = "quota-ledger.io/managed-by"
#: the queue property that says whether a later request that fits may pass a waiting one that
#: does not (``BestEffortFIFO``, the default) or not (``StrictFIFO``); inherited by children
QUEUEING_POLICY = "queueing.policy"
STRICT_FIFO = "StrictFIFO"
BEST_EFFORT_FIFO = "BestEffortFIFO"
QUEUEING_POLICIES = (STRICT_FIFO, BEST_EFFORT_FIFO)

#: YuniKorn's ``uint64`` counts; ``strict`` refuses bools and numeric strings
Count = Annotated[int, Field(ge=0, le=2**64 - 1, strict=True)]


def _none_to_empty(value: object) -> object:
    """``key:`` with nothing after it is YAML null; YuniKorn reads it as an empty list or map."""
    return () if value is None else value


def _int_values_to_text(value: object) -> object:
    """Let YAML ints stand for quantities (``vcore: 2``); they are kept as their decimal text."""
    if isinstance(value, Mapping):
        return {k: str(v) if isinstance(v, int) and not isinstance(v, bool) else v for k, v in value.items()}
    return value


def _go_text(value: object) -> object:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value) if isinstance(value, int | float) else value


def _scalars_to_text(value: object) -> object:
    """Property values are strings to YuniKorn; YAML reads ``10`` and ``true`` as other types."""
    if isinstance(value, Mapping):
        return {k: _go_text(v) for k, v in value.items()}
    return value


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _none_to_text(value: object) -> object:
    """``limit:`` with nothing after it is YAML null; YuniKorn reads it as the empty string."""
    return "" if value is None else value


class Limit(_Model):
    """A user and/or group limit on a queue (or on the partition, which means on root)."""

    #: free text, only used in messages; ``- limit:`` with no value is ""
    limit: str = ""
    users: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    #: resource name -> quantity text, per listed user or group
    maxresources: dict[str, str] = {}
    #: 0 = not limited
    maxapplications: Count = 0

    null_is_empty = field_validator("users", "groups", "maxresources", mode="before")(_none_to_empty)
    null_is_no_text = field_validator("limit", mode="before")(_none_to_text)
    ints_are_quantities = field_validator("maxresources", mode="before")(_int_values_to_text)


class Resources(_Model):
    """A queue's guaranteed and maximum resources, as quantity texts."""

    guaranteed: dict[str, str] | None = None
    max: dict[str, str] | None = None

    ints_are_quantities = field_validator("guaranteed", "max", mode="before")(_int_values_to_text)


class Queue(_Model):
    """One configured queue and its children."""

    name: str
    parent: bool = False
    resources: Resources | None = None
    #: 0 = not limited
    maxapplications: Count = 0
    properties: dict[str, str] = {}
    adminacl: str = ""
    submitacl: str = ""
    childtemplate: dict[str, Any] | None = None
    queues: tuple[Queue, ...] = ()
    limits: tuple[Limit, ...] = ()

    null_is_empty = field_validator("queues", "limits", "properties", mode="before")(_none_to_empty)
    scalars_are_text = field_validator("properties", mode="before")(_scalars_to_text)


class Filter(_Model):
    """A placement rule's user and group filter (checked, never acted on by the ledger)."""

    type: str = ""
    users: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()

    null_is_empty = field_validator("users", "groups", mode="before")(_none_to_empty)


class PlacementRule(_Model):
    """A placement rule: kept and validated as YuniKorn does; the ledger places nothing itself."""

    name: str = ""
    create: Annotated[bool, Field(strict=True)] = False
    filter: Filter | None = None
    parent: PlacementRule | None = None
    value: str = ""


class Preemption(_Model):
    """A partition's preemption switches (kept; the ledger does not preempt)."""

    enabled: Annotated[bool, Field(strict=True)] | None = None
    quotapreemptionenabled: Annotated[bool, Field(strict=True)] | None = None


class NodeSortPolicy(_Model):
    """How YuniKorn sorts nodes (kept; the ledger has no nodes)."""

    type: str = ""
    resourceweights: dict[str, float] = {}

    null_is_empty = field_validator("resourceweights", mode="before")(_none_to_empty)


class UserGroupResolver(_Model):
    """Where YuniKorn looks up a user's groups (kept; the ledger takes groups from the caller)."""

    type: str = ""


class Partition(_Model):
    """One partition: its queue tree, placement rules and partition-level (root) limits.

    Every key YuniKorn accepts on a partition is accepted and kept. The ledger acts on
    ``name``, ``queues`` and ``limits``; ``placementrules`` are validated as YuniKorn validates
    them; ``preemption``, ``nodesortpolicy``, ``usergroupresolver`` and ``statedumpfilepath``
    are only kept. ``unknownnames`` is the ledger's own (see :mod:`quota_ledger.config.typos`).
    """

    name: str = ""
    #: None when not configured at all, which validation refuses
    queues: tuple[Queue, ...] | None = None
    placementrules: tuple[PlacementRule, ...] = ()
    limits: tuple[Limit, ...] = ()
    nodesortpolicy: NodeSortPolicy | None = None
    preemption: Preemption | None = None
    usergroupresolver: UserGroupResolver | None = None
    statedumpfilepath: str = ""
    #: the ledger's own key, not YuniKorn's: ``warn`` (the default when empty) or ``refuse`` a
    #: reservation or a limit that names a resource or a queue the configuration does not know
    unknownnames: str = ""

    null_is_empty = field_validator("placementrules", "limits", mode="before")(_none_to_empty)


class SchedulerConfig(_Model):
    """A whole YuniKorn scheduler configuration; with no partitions it is YuniKorn's default."""

    partitions: tuple[Partition, ...] = ()
    checksum: str = ""

    null_is_empty = field_validator("partitions", mode="before")(_none_to_empty)


class _StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses duplicate keys, as YuniKorn's strict parser does."""


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[object] = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            duplicate = key in seen
        except TypeError:  # unhashable: construct_mapping reports it
            continue
        if duplicate:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping",
                node.start_mark,
                f"found duplicate key {key!r}",
                key_node.start_mark,
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=True)


_StrictLoader.add_constructor("tag:yaml.org,2002:map", _construct_mapping)


def _problem(message: str, partition: str = "", queue: str = "", limit: str = "") -> ConfigProblem:
    return ConfigProblem(partition=partition, queue=queue, limit=limit, message=message)


def _parse_yaml(text: str | bytes) -> object:
    try:
        loader = _StrictLoader(text)  # reads (and may refuse) the first characters already
        try:
            return loader.get_single_data()
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        raise ConfigError([_problem(_yaml_message(exc))]) from exc


def _yaml_message(exc: yaml.YAMLError) -> str:
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        what = ", ".join(part for part in (exc.context, exc.problem) if part)
        return f"invalid YAML at line {mark.line + 1}, column {mark.column + 1}: {what}"
    return f"invalid YAML: {exc}"


def partition_name(name: str) -> str:
    """YuniKorn's partition name: "" and any case of ``default`` are ``default``."""
    return DEFAULT_PARTITION if name == "" or name.lower() == DEFAULT_PARTITION else name


Source = str | bytes | os.PathLike[str] | Mapping[str, Any] | SchedulerConfig


def load(source: Source) -> SchedulerConfig:
    """Parse a configuration: YAML text (``str``/``bytes``), a YAML file (a path), or a mapping.

    Does not normalize or validate (see :func:`normalize` and
    :func:`quota_ledger.config.validate`). An empty document is YuniKorn's default
    configuration (no partitions). Raises :class:`~quota_ledger.model.errors.ConfigError` with one
    problem per mistake found; no YAML or pydantic exception gets out.
    """
    config, problems = load_checked(source)
    if config is None or problems:
        raise ConfigError(problems)
    return config


def load_checked(source: Source) -> tuple[SchedulerConfig | None, list[ConfigProblem]]:
    """Like :func:`load`, but returns the problems; unknown keys do not hide the rest.

    When every mistake is an unknown key, the document without those keys is returned with
    the problems, so that validation can still report what else is wrong.
    """
    if isinstance(source, SchedulerConfig):
        return source, []
    try:
        data = _read(source)
    except ConfigError as error:
        return None, error.problems
    if data is None:
        # YuniKorn loads an empty document as its default configuration: no partitions.
        return SchedulerConfig(), []
    try:
        return SchedulerConfig.model_validate(data), []
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        problems = [_describe(each, data) for each in errors]
    if any(each["type"] != "extra_forbidden" for each in errors):
        return None, problems
    stripped = copy.deepcopy(data)
    for each in errors:
        _remove(stripped, each["loc"])
    try:
        return SchedulerConfig.model_validate(stripped), problems
    except ValidationError:
        return None, problems


def is_empty(source: Source) -> bool:
    """Whether ``source`` is an empty document (no text, only comments, ``{}``): no partitions at all."""
    if isinstance(source, SchedulerConfig):
        return False
    try:
        data = _read(source)
    except ConfigError:
        return False
    return data is None or (isinstance(data, Mapping) and not data)


def _remove(data: object, loc: tuple[str | int, ...]) -> None:
    parent = data
    for key in loc[:-1]:
        parent = _child(parent, key)
    if isinstance(parent, dict):
        parent.pop(loc[-1], None)


def _read(source: str | bytes | os.PathLike[str] | Mapping[str, Any]) -> object:
    data: object
    if isinstance(source, os.PathLike):
        path = os.fspath(source)
        try:
            with open(path, "rb") as file:
                data = _parse_yaml(file.read())
        except OSError as exc:
            raise ConfigError([_problem(f"cannot read configuration file {path}: {exc.strerror}")]) from exc
    elif isinstance(source, str | bytes):
        data = _parse_yaml(source)
    elif isinstance(source, Mapping):
        data = dict(source)
    else:
        data = source
    return data


#: the model that holds the keys found under each key of the document
_MODEL_UNDER: dict[str, type[BaseModel]] = {
    "partitions": Partition,
    "queues": Queue,
    "limits": Limit,
    "resources": Resources,
    "placementrules": PlacementRule,
    "parent": PlacementRule,
    "filter": Filter,
    "preemption": Preemption,
    "nodesortpolicy": NodeSortPolicy,
    "usergroupresolver": UserGroupResolver,
}
#: pydantic error type -> what the value must be, in the ledger's words
_MUST_BE = {
    "string_type": "must be text",
    "bool_type": "must be true or false",
    "int_type": "must be a whole number",
    "int_from_float": "must be a whole number",
    "int_parsing": "must be a whole number",
    "float_type": "must be a number",
    "float_parsing": "must be a number",
    "greater_than_equal": "must be 0 or more",
    "less_than_equal": "is too large (at most 18446744073709551615)",
    "tuple_type": "must be a list",
    "list_type": "must be a list",
    "dict_type": "must be a mapping of keys to values",
    "model_type": "must be a mapping of keys to values",
    "model_attributes_type": "must be a mapping of keys to values",
    "missing": "is required",
}


def _known_keys(loc: tuple[str | int, ...]) -> list[str]:
    """The keys YuniKorn accepts where the unknown key ``loc[-1]`` was found."""
    holder = next(
        (part for part in reversed(loc[:-1]) if isinstance(part, str) and part in _MODEL_UNDER), None
    )
    model = _MODEL_UNDER[holder] if holder is not None else SchedulerConfig
    return list(model.model_fields)


#: what a partition holds: found at the top of a document, they are one level too high
_PARTITION_KEYS = frozenset({"queues", "placementrules", "limits", "nodesortpolicy", "preemption"})


def _describe(error: ErrorDetails, data: object) -> ConfigProblem:
    loc = error["loc"]
    where = ".".join(str(part) for part in loc) or "(document)"
    if error["type"] == "extra_forbidden":
        key = str(loc[-1])
        text = f"unknown key {key!r}"
        close = difflib.get_close_matches(key.lower(), _known_keys(loc), n=1, cutoff=0.6)
        if close:
            text += f" (did you mean {close[0]!r}?)"
        elif len(loc) == 1 and key.lower() in _PARTITION_KEYS:
            # A partition's keys at the top: the document lacks the level that lists partitions.
            text += (
                f": a configuration starts with 'partitions:', a list of partitions, each with its "
                f"{key!r}: partitions: [{{name: default, {key}: ...}}]"
            )
    else:
        text = _MUST_BE.get(error["type"], error["msg"])
    partition, queue, limit = _locate(data, loc)
    return _problem(f"{where}: {text}", partition, queue, limit)


def _child(container: object, key: str | int) -> object:
    if isinstance(key, str) and isinstance(container, Mapping):
        return container.get(key)
    if isinstance(key, int) and isinstance(container, list) and 0 <= key < len(container):
        return container[key]
    return None


def _is_single_root(queues: object) -> bool:
    if not isinstance(queues, list) or len(queues) != 1:
        return False
    name = _child(queues[0], "name")
    return isinstance(name, str) and name.lower() == ROOT


def _locate(data: object, loc: tuple[str | int, ...]) -> tuple[str, str, str]:
    """(partition, queue path, limit) of an error location in the raw document, as normalized."""
    if len(loc) < 2 or loc[0] != "partitions":
        return "", "", ""
    node = _child(_child(data, "partitions"), loc[1])
    if not isinstance(node, Mapping):
        return "", "", ""
    name = node.get("name")
    partition = partition_name(name if isinstance(name, str) else "" if name is None else str(name))
    path: list[str] = []
    for key, index in zip(loc[2::2], loc[3::2], strict=False):
        items = _child(node, key)
        item = _child(items, index)
        if not isinstance(item, Mapping):
            break
        if key == "limits":
            label = item.get("limit")
            return partition, ".".join(path), label if isinstance(label, str) else ""
        if key != "queues":
            break
        child_name = item.get("name")
        child_name = child_name if isinstance(child_name, str) else "?"
        if not path:
            if _is_single_root(items):
                child_name = ROOT
            else:
                path.append(ROOT)
        path.append(child_name)
        node = item
    return partition, ".".join(path), ""


def normalize(cfg: SchedulerConfig) -> SchedulerConfig:
    """What YuniKorn does to a configuration before validating it.

    Partition names "" and any case of ``default`` become ``default``; a queue list that is not
    exactly one ``root`` (any case) is wrapped in a new ``root``; root is named ``root`` and is a
    parent; partition limits are copied onto a root that has none. Nothing that validation must
    still refuse is changed (a missing queue list stays missing).
    """
    return cfg.model_copy(update={"partitions": tuple(_normalize_partition(p) for p in cfg.partitions)})


def _normalize_partition(partition: Partition) -> Partition:
    update: dict[str, Any] = {"name": partition_name(partition.name)}
    queues = partition.queues
    if queues is not None:
        if len(queues) == 1 and queues[0].name.lower() == ROOT:
            root = queues[0].model_copy(update={"name": ROOT, "parent": True})
        else:
            root = Queue(name=ROOT, parent=True, queues=queues)
        if partition.limits and not root.limits:
            root = root.model_copy(update={"limits": partition.limits})
        update["queues"] = (root,)
    return partition.model_copy(update=update)


def dump(cfg: SchedulerConfig) -> dict[str, Any]:
    """A plain dict (lists, dicts, str, int, bool) that :func:`load` accepts again.

    Fields at their defaults are left out.
    """
    plain = _plain(cfg.model_dump(exclude_defaults=True))
    assert isinstance(plain, dict)
    return plain


def _plain(value: object) -> object:
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value
