"""Every name and request shape a caller may send, checked in one place: pure, no I/O.

The Python API, the HTTP service, the CLI, YuniKorn configurations and Kubernetes manifests all
call these functions, so that no entry point accepts what another refuses. Each check returns
the value it accepted or raises :class:`~quota_ledger.model.errors.InvalidRequest` naming the field.

What a name may hold:

- partitions and queue-path segments: YuniKorn's rule, 1-64 of ``a-z A-Z 0-9 _ : # / @ -``;
  queue paths start with ``root`` and are at most 255 characters;
- users, groups, applications, idempotency keys and reservation ids: 1-255 printable
  characters (no NUL, no control character, no lone surrogate);
- Kubernetes names as the API server checks them: namespaces are DNS-1123 labels (at most
  63), object and priority-class names DNS-1123 subdomains (at most 253);
- resource names: letters, digits, ``- _ . /``, at most 253, starting and ending with a
  letter or digit.

Documents (manifests, configurations, JSON bodies) may nest at most :data:`MAX_DEPTH` levels and
hold no NUL byte or lone surrogate in any key or string, so that nothing stored can be refused
by the database afterwards.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sized
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeGuard

from quota_ledger.model.errors import InvalidRequest, TooManyResources

ROOT = "root"
#: longest user, group, application, key or reservation id
MAX_NAME_LENGTH = 255
#: longest queue path (``root.a.b``)
MAX_PATH_LENGTH = 255
#: most groups one request may name
MAX_GROUPS = 256
#: longest a reservation may live, in seconds
MAX_TTL = 7 * 24 * 3600.0
#: deepest nesting of a document (manifest, configuration, JSON body)
MAX_DEPTH = 64
#: most values a document may hold once YAML aliases are expanded (a 1 MiB body holds fewer)
MAX_NODES = 1_000_000

DEFAULT_MAX_RESOURCES_PER_REQUEST = 64
DEFAULT_MAX_RESOURCES_PER_LIMIT_SET = 64
DEFAULT_MAX_RESOURCES_PER_PARTITION = 1024

# YuniKorn's queue name rule (one segment of a path; also a partition name).
_SEGMENT = re.compile(r"[a-zA-Z0-9_:#/@-]{1,64}", re.ASCII)
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", re.ASCII)
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*", re.ASCII)
_RESOURCE = re.compile(r"[A-Za-z0-9](?:[-A-Za-z0-9_./]*[A-Za-z0-9])?", re.ASCII)
_SEGMENT_RULE = "1-64 of a-z A-Z 0-9 _ : # / @ -"
# yaml is imported by the functions that read YAML, not with this module: the command line
# imports it to parse its arguments, and most commands read no YAML.
#: the parser whose events yaml_problem reads first; None: libyaml's when installed (the
#: pure-Python scanner takes seconds over deep flow nesting), else PyYAML's own
_EVENTS: Any = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Bounds:
    """How many resources one request, one limit set and one partition may name.

    A request (reserve, release, commit, set_limits) naming more than ``resources_per_request``,
    a limit set (a queue's ``max``, a user or group limit, a ResourceQuota's ``hard``) naming more
    than ``resources_per_limit_set``, or a reservation or configuration that would bring the
    distinct resource names of a partition above ``resources_per_partition`` raises
    :class:`~quota_ledger.model.errors.TooManyResources`.
    """

    resources_per_request: int = DEFAULT_MAX_RESOURCES_PER_REQUEST
    resources_per_limit_set: int = DEFAULT_MAX_RESOURCES_PER_LIMIT_SET
    resources_per_partition: int = DEFAULT_MAX_RESOURCES_PER_PARTITION

    def __post_init__(self) -> None:
        for name in ("resources_per_request", "resources_per_limit_set", "resources_per_partition"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidRequest(f"max_{name} must be a positive integer", field=f"max_{name}")

    def request(self, resources: Sized, field: str = "resources") -> None:
        """Refuse a request naming more resources than allowed."""
        if len(resources) > self.resources_per_request:
            raise TooManyResources("request", len(resources), self.resources_per_request, field=field)

    def limit_set(self, resources: Sized, field: str = "resources") -> None:
        """Refuse a limit set naming more resources than allowed."""
        if len(resources) > self.resources_per_limit_set:
            raise TooManyResources("limit set", len(resources), self.resources_per_limit_set, field=field)

    def partition(self, names: Sized, partition: str) -> None:
        """Refuse when a partition would count more distinct resource names than allowed."""
        if len(names) > self.resources_per_partition:
            raise TooManyResources(
                f"partition {partition!r}", len(names), self.resources_per_partition, field="resources"
            )


# -- text ----------------------------------------------------------------------------------------
def clean(text: str) -> bool:
    """Whether ``text`` holds no NUL byte and no lone surrogate (it can be stored as UTF-8)."""
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _shown(value: object) -> str:
    """``value`` for an error message: never huge, never unencodable."""
    text = repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def name(value: object, field: str) -> str:
    """A user, group, application, key or reservation id: 1-255 printable characters."""
    if not isinstance(value, str) or not value or len(value) > MAX_NAME_LENGTH or not value.isprintable():
        raise InvalidRequest(
            f"{field} must be a printable string of 1-{MAX_NAME_LENGTH} characters, not {_shown(value)}",
            field=field,
        )
    return value


def optional_name(value: object, field: str) -> str | None:
    """:func:`name`, or None."""
    return None if value is None else name(value, field)


def reservation_id(value: object) -> str:
    """A reservation id (as returned by ``reserve``); any other printable text is simply unknown."""
    return name(value, "id")


def names(values: object, field: str) -> tuple[str, ...]:
    """A list of names (``groups``): None is no names; a string, a non-list or a bad item is refused."""
    if values is None:
        return ()
    if isinstance(values, str | bytes | Mapping) or not isinstance(values, Iterable):
        raise InvalidRequest(f"{field} must be a list of names, not {_shown(values)}", field=field)
    found = tuple(values)
    if len(found) > MAX_GROUPS:
        raise InvalidRequest(f"{field} may name at most {MAX_GROUPS}", field=field)
    return tuple(name(v, field) for v in found)


def flag(value: object, field: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidRequest(f"{field} must be True or False", field=field)
    return value


def ttl(value: object) -> float:
    """A time to live: seconds (int or float, not bool) or a timedelta, > 0 and at most a week."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int) and not isinstance(value, bool):
        seconds = float(max(-1, min(value, 2 * int(MAX_TTL))))  # huge ints do not fit a float
    elif isinstance(value, float):
        seconds = value
    else:
        raise InvalidRequest(f"ttl must be seconds or a timedelta, not {_shown(value)}", field="ttl")
    if not 0 < seconds <= MAX_TTL:  # NaN fails both
        # The value sent, not the clamped one a huge int became.
        sent = f"{seconds:g}" if isinstance(value, timedelta) else _shown(value)
        raise InvalidRequest(f"ttl must be > 0 and at most {MAX_TTL:.0f} seconds, not {sent}", field="ttl")
    return seconds


def sweep_options(batch_size: object, max_batches: object, workers: object, max_rate: object) -> None:
    """The options of an expiry sweep (see :meth:`QuotaEngine.expire`)."""
    for value, name in ((batch_size, "batch_size"), (workers, "workers")):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidRequest(f"{name} must be a positive integer", field=name)
    if max_batches is not None and (
        isinstance(max_batches, bool) or not isinstance(max_batches, int) or max_batches < 0
    ):
        raise InvalidRequest("max_batches must be a non-negative integer or None", field="max_batches")
    if max_rate is not None and (
        isinstance(max_rate, bool)
        or not isinstance(max_rate, int | float)
        or (isinstance(max_rate, float) and not math.isfinite(max_rate))
        or max_rate <= 0
    ):
        raise InvalidRequest("max_rate must be a positive number of rows per second", field="max_rate")


# -- YuniKorn names -------------------------------------------------------------------------------
def partition(value: object) -> str:
    """A partition name (YuniKorn's queue-name rule)."""
    if not isinstance(value, str) or not _SEGMENT.fullmatch(value):
        raise InvalidRequest(f"invalid partition name {_shown(value)}: {_SEGMENT_RULE}", field="partition")
    return value


def optional_partition(value: object) -> str | None:
    """:func:`partition`, or None for every partition; "" is refused, never "all"."""
    return None if value is None else partition(value)


def queue(value: object, field: str = "queue") -> str:
    """A fully qualified queue path such as ``root.a.b``."""
    if not isinstance(value, str) or len(value) > MAX_PATH_LENGTH:
        raise InvalidRequest(f"invalid queue path {_shown(value)}", field=field)
    segments = value.split(".")
    if segments[0] != ROOT:
        raise InvalidRequest(
            f"invalid queue path {_shown(value)}: it must start with {ROOT!r} (e.g. root.project-a)",
            field=field,
        )
    for segment in segments:
        if not _SEGMENT.fullmatch(segment):
            raise InvalidRequest(
                f"invalid queue path {_shown(value)}: segment {_shown(segment)} must be {_SEGMENT_RULE}",
                field=field,
            )
    return value


# -- Kubernetes names -----------------------------------------------------------------------------
def is_label(value: object) -> TypeGuard[str]:
    """Whether ``value`` is a DNS-1123 label (a namespace name)."""
    return isinstance(value, str) and len(value) <= 63 and _LABEL.fullmatch(value) is not None


def is_subdomain(value: object) -> TypeGuard[str]:
    """Whether ``value`` is a DNS-1123 subdomain (most Kubernetes object names)."""
    return isinstance(value, str) and len(value) <= 253 and _SUBDOMAIN.fullmatch(value) is not None


def namespace(value: object, field: str = "namespace") -> str:
    """A Kubernetes namespace: a DNS-1123 label (lower case, digits, '-'; at most 63)."""
    if not is_label(value):
        raise InvalidRequest(
            f"invalid {field} {_shown(value)}: a DNS-1123 label (a-z 0-9 '-', at most 63, "
            "starting and ending with a letter or digit)",
            field=field,
        )
    return value


def subdomain(value: object, field: str) -> str:
    """A Kubernetes object name: a DNS-1123 subdomain (labels joined by '.'; at most 253)."""
    if not is_subdomain(value):
        raise InvalidRequest(
            f"invalid {field} {_shown(value)}: a DNS-1123 subdomain (a-z 0-9 '-' '.', at most 253, "
            "starting and ending with a letter or digit)",
            field=field,
        )
    return value


def priority_class(value: object, field: str = "priority_class") -> str | None:
    """A priority class name (a DNS-1123 subdomain), or None."""
    return None if value is None else subdomain(value, field)


def resource(value: object) -> str:
    """A resource name: letters, digits, '-', '_', '.', '/'; at most 253."""
    if not isinstance(value, str) or len(value) > 253 or not _RESOURCE.fullmatch(value):
        raise InvalidRequest(
            f"invalid resource name {_shown(value)}: use letters, digits, '-', '_', '.', '/' "
            "(at most 253, starting and ending with a letter or digit)",
            field=value if isinstance(value, str) and clean(value) else "resources",
        )
    return value


# -- documents ------------------------------------------------------------------------------------
def document_problem(value: object, max_depth: int = MAX_DEPTH) -> str | None:
    """Why a parsed document (dicts, lists, scalars) cannot be taken, or None."""
    found = _document_issue(value, max_depth)
    return None if found is None else found[1]


def document(value: object, field: str, max_depth: int = MAX_DEPTH) -> Any:
    """Return ``value`` if :func:`document_problem` finds nothing, else raise InvalidRequest
    naming the field that holds a NUL byte or a lone surrogate (or ``field`` itself)."""
    found = _document_issue(value, max_depth)
    if found is not None:
        where, problem = found
        raise InvalidRequest(problem, field=where or field)
    return value


def _document_issue(value: object, max_depth: int) -> tuple[str, str] | None:
    """(field path or "", why) of the first thing a document may not hold.

    Walks without recursion, so any nesting is measured safely; a value shared by YAML aliases
    is counted each time it is reached, so an exponential expansion is refused too.
    """
    stack: list[tuple[object, int, str]] = [(value, 1, "")]
    seen = 0
    while stack:
        item, depth, where = stack.pop()
        seen += 1
        if seen > MAX_NODES:
            return "", f"the document holds more than {MAX_NODES} values"
        if isinstance(item, Mapping | list | tuple):
            if depth > max_depth:
                return "", f"the document nests deeper than {max_depth} levels"
            if isinstance(item, Mapping):
                for key, child in item.items():
                    if isinstance(key, str) and not clean(key):
                        return (
                            where,
                            f"{where or 'the document'} has a key with a NUL byte or a lone surrogate",
                        )
                    step = key if isinstance(key, str) else _shown(key)
                    stack.append((child, depth + 1, f"{where}.{step}" if where else step))
            else:
                stack.extend((child, depth + 1, f"{where}[{i}]") for i, child in enumerate(item))
        elif isinstance(item, str) and not clean(item):
            return where, f"{where or 'the document'} holds a NUL byte or a lone surrogate"
    return None


def yaml_problem(text: str | bytes, max_depth: int = MAX_DEPTH) -> str | None:
    """Why a YAML (or JSON) text cannot be taken, or None: too deep, too many values once its
    aliases are expanded, a NUL byte or a lone surrogate.

    Reads the parser's events, which needs no recursion, before anything builds the nested
    objects (PyYAML's constructor recurses and would overflow the stack). libyaml refuses a
    text nested about a thousand levels deep while it scans ahead, before it has given the
    events that would show it; such a text is read again by PyYAML's own parser, which gives
    them, so a syntax error is left to the real load and a deep text is refused here.
    """
    import yaml

    if isinstance(text, str) and not clean(text):
        return "the document holds a NUL byte or a lone surrogate"
    events = _EVENTS or getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    for loader in dict.fromkeys((events, yaml.SafeLoader)):
        try:
            return _measured(text, loader, max_depth)
        except yaml.YAMLError:
            continue
    return None  # the real load reports the syntax error with its position


def _measured(text: str | bytes, loader: Any, max_depth: int) -> str | None:
    """:func:`yaml_problem` by the events of ``loader`` (its YAMLError raised)."""
    import yaml

    # One [anchor, values] per open collection; anchors -> values of the anchored node.
    open_: list[list[Any]] = [[None, 0]]
    anchors: dict[str, int] = {}
    total = 0
    for event in yaml.parse(text, Loader=loader):
        if isinstance(event, yaml.CollectionStartEvent):
            if len(open_) > max_depth:
                return f"the document nests deeper than {max_depth} levels"
            open_.append([event.anchor, 1])
            total += 1
        elif isinstance(event, yaml.CollectionEndEvent):
            anchor, count = open_.pop()
            if anchor is not None:
                anchors[anchor] = count
            open_[-1][1] += count
        elif isinstance(event, yaml.ScalarEvent):
            if event.anchor is not None:
                anchors[event.anchor] = 1
            open_[-1][1] += 1
            total += 1
        elif isinstance(event, yaml.AliasEvent):
            size = anchors.get(event.anchor or "", 1)
            open_[-1][1] += size
            total += size
        if total > MAX_NODES:
            return f"the document holds more than {MAX_NODES} values"
    return None


def manifest(value: object, field: str) -> Any:
    """A manifest given as YAML/JSON text or as parsed data, checked by :func:`document`."""
    if isinstance(value, str | bytes):
        return load_yaml(value, field)
    return document(value, field)


def load_yaml(text: str | bytes, field: str) -> Any:
    """A YAML or JSON document, refused with InvalidRequest when malformed, too deep or unclean."""
    import yaml

    problem = yaml_problem(text)
    if problem is not None:
        raise InvalidRequest(problem, field=field)
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise InvalidRequest(f"not a YAML or JSON document: {error}", field=field) from error
    return document(loaded, field)
