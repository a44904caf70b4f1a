"""Property-based test of /v1 from its own OpenAPI schema (schemathesis): valid and invalid
requests to every operation, as the owner persona; 0 server errors, every status declared, every
response body matching its declared schema (issue 9, "Must show")."""

from __future__ import annotations

import time

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Ok
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

pytestmark = pytest.mark.e2e

EXAMPLES_PER_OPERATION = 60  # ~13 operations: several hundred cases, well under a minute
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance]


def _exercise(operation, base_url: str, headers: dict[str, str], statuses: dict[int, int]) -> int:
    """Run the operation's generated cases; returns how many were sent."""
    sent = 0

    @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, database=None,
              derandomize=True, phases=[Phase.explicit, Phase.generate, Phase.shrink],
              suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy())
    def check(case):
        nonlocal sent
        sent += 1
        response = case.call(base_url=base_url, headers=headers, timeout=30)
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
        case.validate_response(response, checks=CHECKS)

    check()
    return sent


def test_every_operation_answers_as_its_schema_declares(farm, personas, capsys):
    schema = schemathesis.openapi.from_url(f"{farm.url}/v1/openapi.json")
    headers = {"Authorization": f"Bearer {personas['owner']}"}
    counts: dict[str, int] = {}
    statuses: dict[int, int] = {}
    started = time.monotonic()
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), f"the schema has an invalid operation: {result.err()}"
        operation = result.ok()
        label = f"{operation.method.upper()} {operation.path}"
        counts[label] = _exercise(operation, farm.url, headers, statuses)
    total = sum(counts.values())
    with capsys.disabled():
        print(f"\nschemathesis: {total} generated cases over {len(counts)} operations in "
              f"{time.monotonic() - started:.1f} s; statuses {dict(sorted(statuses.items()))}")
    assert len(counts) >= 12
    assert all(n > 0 for n in counts.values()), counts
    assert not [s for s in statuses if s >= 500], statuses
