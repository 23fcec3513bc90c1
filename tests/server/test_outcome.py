"""Finish reasons and request outcomes are enums whose values are the wire format: JSON, logs and
the `outcome` label of `specserve_requests_total` carry the same strings as before they were."""

from __future__ import annotations

import json

from specserve.outputs import RequestOutput
from specserve.request import FinishReason
from specserve.server.errors import ErrorKind
from specserve.server.outcome import Outcome
from specserve.server.service import outcome_of


def final(reason: FinishReason) -> RequestOutput:
    return RequestOutput("r", [], "", True, reason, 3, 1)


def test_the_values_are_the_strings_the_wire_carries() -> None:
    assert [r.value for r in FinishReason] == ["eos", "stop", "length", "abort", "error"]
    assert json.dumps([FinishReason.EOS, Outcome.TOO_LARGE]) == '["eos", "too_large"]'
    assert f"{FinishReason.ABORT}" == "abort" and str(Outcome.SUCCESS) == "success"


def test_every_error_kind_counts_as_its_outcome() -> None:
    assert {k: k.outcome.value for k in ErrorKind} == {
        ErrorKind.VALIDATION: "invalid",
        ErrorKind.OVERLOADED: "overloaded",
        ErrorKind.GENERATION: "error",
        ErrorKind.UNAUTHORIZED: "unauthorized",
        ErrorKind.FORBIDDEN: "forbidden",
        ErrorKind.TOO_LARGE: "too_large",
        ErrorKind.UNAVAILABLE: "unavailable",
        ErrorKind.NOT_FOUND: "not_found",
        ErrorKind.MODEL_NOT_FOUND: "invalid",
    }


def test_a_request_outcome_is_its_worst_choice() -> None:
    done, abort, error = FinishReason.LENGTH, FinishReason.ABORT, FinishReason.ERROR
    assert outcome_of([final(done), final(FinishReason.EOS)]) is Outcome.SUCCESS
    assert outcome_of([final(done), final(abort)]) is Outcome.CANCELLED
    assert outcome_of([final(abort), final(error), final(done)]) is Outcome.ERROR


def test_failed_is_a_final_error_or_abort() -> None:
    assert [final(r).failed for r in FinishReason] == [False, False, False, True, True]
    assert not RequestOutput("r", [1], "a", False, None, 3, 1).failed
