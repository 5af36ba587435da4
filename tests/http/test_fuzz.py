"""Property-based fuzzing of every operation in the OpenAPI document, through the real server.

Whatever schemathesis sends (valid or not), the service must never answer 5xx, and every answer
must match the document (status codes, content types and response schemas).
"""

from __future__ import annotations

import schemathesis
from http_support import Service
from hypothesis import HealthCheck, Phase, given, settings
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
