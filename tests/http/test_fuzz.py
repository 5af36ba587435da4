"""Property-based fuzzing of every operation in the OpenAPI document, through the real server.

Whatever schemathesis sends (valid or not), the service must never answer 5xx, and every answer
must match the document (status codes, content types and response schemas). A second run spoils
what schemathesis generates with hostile values (NUL bytes, lone surrogates, SQL-like and huge
text, huge numbers, deep nesting, thousands of resources): never a 5xx either.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import httpx
import schemathesis
from http_support import Service
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

EXAMPLES_PER_OPERATION = 25


def test_no_operation_ever_answers_a_server_error(service: Service) -> None:
    headers = {"Authorization": f"Bearer {service.tokens['admin']}"}
    schema = schemathesis.openapi.from_url(f"{service.base}/openapi.json", headers=headers)
    checks = [
        schemathesis.checks.not_a_server_error,
        status_code_conformance,
        content_type_conformance,
        response_schema_conformance,
    ]
    failures: list[str] = []
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 20
    for operation in operations:
        if operation.path in ("/metrics", "/ui"):
            continue  # not JSON: checked by their own tests

        @given(case=operation.as_strategy())
        @settings(
            max_examples=EXAMPLES_PER_OPERATION,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            phases=[Phase.explicit, Phase.generate],
            database=None,
        )
        def run(case: schemathesis.Case) -> None:
            case.call_and_validate(headers=headers, checks=checks)

        try:
            run()
        except Exception as error:
            failures.append(f"{operation.method.upper()} {operation.path}: {error}")
    assert not failures, "\n\n".join(failures)


HOSTILE_EXAMPLES_PER_OPERATION = 6
_TEXT = st.text(max_size=8)
#: strings that must be refused as names, or at least never crash the service
HOSTILE_STRINGS = st.one_of(
    st.sampled_from(
        [
            "\x00",
            "a\x00b",
            "\ud800",
            "x\udfff",
            "'; DROP TABLE reservations; --",
            "ä" * 300,
            "root.\x00",
            "%00",
        ]
    ),
    st.builds(lambda a, p, b: a + p + b, _TEXT, st.sampled_from(["\x00", "\ud800", "\udc80", "\x1b"]), _TEXT),
    st.integers(256, 20_000).map(lambda n: "x" * n),
)
#: NUL bytes and huge texts travel in URLs; lone surrogates cannot be encoded there
URL_STRINGS = st.one_of(
    st.sampled_from(["\x00", "a\x00b", "'; --", "ä" * 300, "%00", "%ED%A0%80"]),
    st.integers(256, 5000).map(lambda n: "x" * n),
)


def _nested(depth: int) -> Any:
    value: Any = "x"
    for level in range(depth):
        value = {"a": value} if level % 2 else [value]
    return value


HOSTILE_VALUES = st.one_of(
    HOSTILE_STRINGS,
    st.sampled_from([2**63, 2**64, 10**30, -(2**70), 1e308, -1, 0, 2.0, True, False, None, [], {}]),
    st.integers(65, 500).map(_nested),  # deeper still is refused by the JSON parser itself
    st.integers(65, 1000).map(lambda n: {f"r{i}": 1 for i in range(n)}),
)


def _spoil(body: Any, data: st.DataObject) -> Any:
    """Replace one value somewhere in ``body`` (or the body itself) with a hostile one."""
    if isinstance(body, dict) and body and data.draw(st.booleans()):
        key = data.draw(st.sampled_from(sorted(body, key=str)))
        return {**body, key: _spoil(body[key], data)}
    if isinstance(body, list) and body and data.draw(st.booleans()):
        index = data.draw(st.integers(0, len(body) - 1))
        return [*body[:index], _spoil(body[index], data), *body[index + 1 :]]
    return data.draw(HOSTILE_VALUES)


def test_hostile_input_never_answers_a_server_error(service: Service) -> None:
    headers = {"Authorization": f"Bearer {service.tokens['admin']}"}
    schema = schemathesis.openapi.from_url(f"{service.base}/openapi.json", headers=headers)
    failures: list[str] = []
    for operation in [result.ok() for result in schema.get_all_operations()]:
        if operation.path in ("/metrics", "/ui"):
            continue

        @given(case=operation.as_strategy(), data=st.data())
        @settings(
            max_examples=HOSTILE_EXAMPLES_PER_OPERATION,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            phases=[Phase.generate],
            database=None,
        )
        def run(case: schemathesis.Case, data: st.DataObject) -> None:
            if case.path_parameters and data.draw(st.booleans()):
                name = data.draw(st.sampled_from(sorted(case.path_parameters)))
                case.path_parameters = {**case.path_parameters, name: data.draw(URL_STRINGS)}
            if case.query and data.draw(st.booleans()):
                name = data.draw(st.sampled_from(sorted(case.query)))
                case.query = {**case.query, name: data.draw(URL_STRINGS)}
            sent = dict(headers)
            content = None
            if case.method.upper() in ("POST", "PUT", "DELETE") and case.media_type is not None:
                sent["content-type"] = case.media_type
                body = _spoil(case.body, data) if case.media_type == "application/json" else case.body
                # Serialized here: JSON escapes lone surrogates; other text keeps them as raw bytes.
                text = json.dumps(body) if case.media_type == "application/json" else str(body)
                content = text.encode("utf-8", "surrogatepass")
            path = case.path
            for name, value in (case.path_parameters or {}).items():
                text = str(value)
                # "%.." values are sent as they are (a NUL, invalid UTF-8); the rest is encoded.
                path = path.replace(f"{{{name}}}", text if text.startswith("%") else quote(text, safe=""))
            response = httpx.request(
                case.method, service.base + path, params=case.query, content=content, headers=sent
            )
            assert response.status_code < 500, f"{case.method} {case.formatted_path}: {response.status_code}"

        try:
            run()
        except Exception as error:
            failures.append(f"{operation.method.upper()} {operation.path}: {error}")
    assert not failures, "\n\n".join(failures)
