"""The expected outcome of an irreversible step and the dialog a click opens, in the file
format."""

from __future__ import annotations

import json
from typing import Any, Literal

import pytest
import yaml
from pydantic import ValidationError

from workflows.fileformat import dump_document, load_document
from workflows.schema import STEP_ADAPTER, WorkflowDocument, describe_step, document_problems

PAY: dict[str, Any] = {
    "id": "pay",
    "type": "click",
    "irreversible": True,
    "target": {"role": "button", "name": "Submit payment"},
}


def document(*steps: dict[str, Any]) -> WorkflowDocument:
    return WorkflowDocument.model_validate(
        {
            "name": "Pay",
            "slug": "pay",
            "settings": {"allowed_hosts": ["127.0.0.1:8001"]},
            "parameters": [{"name": "invoice", "type": "string"}],
            "steps": list(steps),
        }
    )


def messages(doc: WorkflowDocument) -> list[str]:
    return [f"{p.where(list(doc.steps))}: {p.message}" for p in document_problems(doc)]


def test_it_refuses_to_publish_an_irreversible_step_without_an_expected_outcome() -> None:
    doc = document(PAY)

    assert messages(doc) == [
        "step 1 'pay', field expect: an irreversible step must say how the portal shows that it "
        "worked (expect a text, an address or an element, e.g. expect: text: Payment submitted); "
        "without it a refused action would be reported as done"
    ]


@pytest.mark.parametrize(
    "expect",
    [
        {"text": "Payment {{ params.invoice }} submitted"},
        {"url": "**/receipts/*"},
        {"target": {"role": "heading", "name": "Receipt"}},
    ],
)
def test_an_irreversible_step_with_an_expected_outcome_may_be_published(
    expect: dict[str, Any],
) -> None:
    assert messages(document({**PAY, "expect": expect})) == []


def test_an_expected_outcome_is_exactly_one_thing() -> None:
    with pytest.raises(ValidationError, match="expect exactly one of: text"):
        STEP_ADAPTER.validate_python({**PAY, "expect": {"text": "Paid", "url": "**/r/*"}})
    with pytest.raises(ValidationError, match="expect exactly one of: text"):
        STEP_ADAPTER.validate_python({**PAY, "expect": {}})


def test_an_expected_text_may_only_use_known_references() -> None:
    doc = document({**PAY, "expect": {"text": "Paid {{ params.nope }}"}})

    assert messages(doc) == ["step 1 'pay', field expect.text: there is no parameter 'nope'"]


def test_a_prompt_text_needs_an_accepted_dialog() -> None:
    with pytest.raises(ValidationError, match="add dialog: accept"):
        STEP_ADAPTER.validate_python({**PAY, "dialog": "dismiss", "prompt_text": "yes"})
    step = STEP_ADAPTER.validate_python({**PAY, "dialog": "accept", "prompt_text": "DELETE"})
    assert describe_step(step) == (
        "Click the button 'Submit payment' and accept the dialog it opens — irreversible"
    )


@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_expect_and_dialog_round_trip_exactly(fmt: Literal["yaml", "json"]) -> None:
    step = {
        **PAY,
        "dialog": "accept",
        "prompt_text": "{{ params.invoice }}",
        "expect": {"target": {"role": "alert", "name": "Deleted", "exact": True}},
    }
    doc = document(step, {**PAY, "id": "again", "expect": {"url": "**/receipts/*"}})

    text = dump_document(doc, fmt=fmt)
    again = load_document(text)

    assert again == doc
    loaded = yaml.safe_load(text) if fmt == "yaml" else json.loads(text)
    assert loaded["steps"][0]["expect"] == {
        "target": {"role": "alert", "name": "Deleted", "exact": True}
    }
    assert loaded["steps"][0]["dialog"] == "accept"
