"""Property-based fuzzing of the server's own OpenAPI schema: no input may produce a 5xx.

Slow (select with `-m slow`). A dedicated tiny server with a 128-token context keeps every
generated request short, whatever max_new_tokens / max_tokens the fuzzer picks. Both valid
(positive) and schema-violating (negative) inputs are generated. Operations are
driven through schemathesis' Python API (its lazy pytest loader does not support pytest 9).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error

from tests.server.conftest import Server, start_server

pytestmark = pytest.mark.slow
EXAMPLES_PER_OPERATION = 25


@pytest.fixture(scope="module")
def fuzz_server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("logs") / "fuzz-server.log"
    flags = [
        "--model",
        str(tiny_model),
        "--speculate",
        "4",
        "--max-total-tokens",
        "128",
        "--kv-cache-bytes",
        "8000000",
        "--max-body-bytes",
        "100000",
    ]
    server = start_server(flags, log)
    yield server
    server.stop()


def test_no_server_errors(fuzz_server: Server) -> None:
    schema = schemathesis.openapi.from_url(fuzz_server.url + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/generate", "/v1/chat/completions", "/metrics"}
    # An operation without a body or parameters (every GET, POST /reset_suffix_cache) has no
    # invalid form: only the others get negative cases.
    cases = [
        (op, mode)
        for op, mode in itertools.product(operations, schemathesis.GenerationMode)
        if len(op.body) or mode is schemathesis.GenerationMode.POSITIVE
    ]
    for op, mode in cases:

        @given(case=op.as_strategy(generation_mode=mode))
        @settings(
            max_examples=EXAMPLES_PER_OPERATION,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def no_5xx(case: schemathesis.Case) -> None:
            case.call_and_validate(checks=[not_a_server_error], timeout=60)

        no_5xx()
