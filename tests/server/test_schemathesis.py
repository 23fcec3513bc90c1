"""Property-based fuzzing of the server's own OpenAPI schema: no input may produce a 5xx.

Every route of both APIs (the test checks the schema lists them all), with valid (positive)
and schema-violating (negative) inputs, a bounded number of examples each, in the default run
(about 15 s). A dedicated tiny server with a 128-token context keeps every generated request
short, whatever max_new_tokens / max_tokens the fuzzer picks. Operations are driven through
schemathesis' Python API (its lazy pytest loader does not support pytest 9).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Ok

from tests.server.conftest import Server, start_server

EXAMPLES_PER_OPERATION = 25
ROUTES = {
    ("POST", "/generate"),
    ("POST", "/generate_stream"),
    ("POST", "/"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/responses"),
    ("GET", "/v1/responses/{response_id}"),
    ("DELETE", "/v1/responses/{response_id}"),
    ("GET", "/v1/models"),
    ("GET", "/v1/models/{model_id}"),
    ("GET", "/info"),
    ("GET", "/health"),
    ("HEAD", "/health"),
    ("GET", "/metrics"),
    ("POST", "/tokenize"),
    ("POST", "/detokenize"),
    ("POST", "/reset_suffix_cache"),
    ("POST", "/reset_prefix_cache"),
}


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
    operations = []
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), result.err()  # the schema of every operation is valid
        operations.append(result.ok())
    assert {(op.method.upper(), op.path) for op in operations} == ROUTES
    # Only operations with a body have invalid forms (any string is a valid model id; POST
    # /reset_suffix_cache takes nothing).
    cases = [
        (op, mode)
        for op, mode in itertools.product(operations, schemathesis.GenerationMode)
        if mode is schemathesis.GenerationMode.POSITIVE or len(op.body)
    ]
    calls: Counter[str] = Counter()
    for op, mode in cases:

        @given(case=op.as_strategy(generation_mode=mode))
        @settings(
            max_examples=EXAMPLES_PER_OPERATION,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def no_5xx(case: schemathesis.Case) -> None:
            calls[f"{case.method} {case.path}"] += 1
            case.call_and_validate(checks=[not_a_server_error], timeout=60)

        no_5xx()
    assert {f"{m} {p}" for m, p in ROUTES} == set(calls)  # every route was really called
