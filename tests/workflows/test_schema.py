from __future__ import annotations

from datetime import date
from decimal import Decimal
from typing import Any

import pytest
from pydantic import ValidationError

from sessions.engine.steps.language import Target, references
from workflows.hosts import HostPatternError, host_allowed, parse_host_pattern
from workflows.schema import (
    STEP_ADAPTER,
    Parameter,
    WorkflowDocument,
    describe_step,
    document_problems,
    irreversible_warnings,
)


def document(**overrides: Any) -> WorkflowDocument:
    data: dict[str, Any] = {
        "name": "Pay an invoice",
        "slug": "pay-invoice",
        "settings": {"allowed_hosts": ["127.0.0.1:8001"], "credentials": ["acme"]},
        "parameters": [{"name": "amount", "type": "money", "currency": "EUR"}],
        "steps": [{"id": "open", "type": "goto", "url": "http://127.0.0.1:8001/login"}],
    }
    data.update(overrides)
    return WorkflowDocument.model_validate(data)


def messages(doc: WorkflowDocument, **kwargs: Any) -> list[str]:
    return [f"{p.where(list(doc.steps))}: {p.message}" for p in document_problems(doc, **kwargs)]


@pytest.mark.parametrize(
    ("compact", "expected"),
    [
        ('button "Submit payment"', {"role": "button", "name": "Submit payment"}),
        ("label Username", {"label": "Username"}),
        ('css "#total > td" nth=2', {"css": "#total > td", "nth": 2}),
        (
            'testid pay-btn exact frame="iframe#inner"',
            {"test_id": "pay-btn", "exact": True, "frame": ["iframe#inner"]},
        ),
        ("heading", {"role": "heading"}),
    ],
)
def test_targets_read_and_write_the_compact_form(compact: str, expected: dict[str, Any]) -> None:
    target = Target.from_compact(compact)

    assert target == Target.model_validate(expected)
    assert Target.from_compact(target.to_compact()) == target


@pytest.mark.parametrize(
    ("compact", "message"),
    [
        ('buton "Pay"', "'buton' is not a role"),
        ("label", "say which label"),
        ('button "Pay" nth=-1', "greater than or equal to 0"),
        ('button "Pay" loud', "unknown option 'loud'"),
        ('button "Pay', "cannot read the target"),
    ],
)
def test_a_wrong_target_says_what_is_wrong(compact: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Target.from_compact(compact)


def test_a_target_needs_exactly_one_way_to_find_it() -> None:
    with pytest.raises(ValidationError, match="exactly one of role, label"):
        Target.model_validate({"label": "User", "css": "#u"})
    with pytest.raises(ValidationError, match="'name' goes with 'role'"):
        Target.model_validate({"name": "Pay", "text": "Pay"})


def test_each_step_reads_as_a_sentence() -> None:
    click = STEP_ADAPTER.validate_python(
        {
            "id": "pay",
            "type": "click",
            "irreversible": True,
            "target": {"role": "button", "name": "Submit payment"},
        }
    )
    fill = STEP_ADAPTER.validate_python(
        {
            "id": "pw",
            "type": "fill",
            "target": {"label": "Password"},
            "value": "{{ secrets.acme.password }}",
        }
    )

    assert describe_step(click) == "Click the button 'Submit payment' — irreversible"
    assert describe_step(fill) == "Fill the field labelled 'Password' with a secret"


def test_unknown_fields_and_types_are_refused() -> None:
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        STEP_ADAPTER.validate_python({"id": "a", "type": "click", "target": {"text": "x"}, "x": 1})
    with pytest.raises(ValidationError, match="does not match any of the expected tags"):
        STEP_ADAPTER.validate_python({"id": "a", "type": "hover"})


def test_a_wait_needs_exactly_one_condition() -> None:
    with pytest.raises(ValidationError, match="exactly one of"):
        STEP_ADAPTER.validate_python({"id": "w", "type": "wait_for", "text": "a", "url": "b"})


def test_press_accepts_key_names_only() -> None:
    ok = STEP_ADAPTER.validate_python({"id": "k", "type": "press", "key": "Control+A"})
    assert ok.key == "Control+A"  # type: ignore[attr-defined]
    with pytest.raises(ValidationError, match="'Ctrl-A' is not a key name"):
        STEP_ADAPTER.validate_python({"id": "k", "type": "press", "key": "Ctrl-A"})


def test_extract_options_must_fit_the_kind() -> None:
    with pytest.raises(ValidationError, match="'attribute' is required"):
        STEP_ADAPTER.validate_python(
            {
                "id": "e",
                "type": "extract",
                "fields": [{"name": "link", "kind": "attribute", "target": {"css": "a"}}],
            }
        )
    with pytest.raises(ValidationError, match="kind rows needs 'columns'"):
        STEP_ADAPTER.validate_python(
            {
                "id": "e",
                "type": "extract",
                "fields": [{"name": "rows", "kind": "rows", "target": {"css": "tr"}}],
            }
        )


def test_references_must_exist_and_come_from_earlier_steps() -> None:
    doc = document(
        steps=[
            {"id": "open", "type": "goto", "url": "http://127.0.0.1:8001/pay/{{ params.invoice }}"},
            {
                "id": "check",
                "type": "assert",
                "checks": [
                    {
                        "kind": "compare",
                        "left": "outputs.total",
                        "op": "==",
                        "right": "params.amount",
                    }
                ],
            },
            {
                "id": "read",
                "type": "extract",
                "fields": [{"name": "total", "kind": "money", "target": {"css": "#total"}}],
            },
        ]
    )

    assert messages(doc) == [
        "step 1 'open', field url: there is no parameter 'invoice'",
        "step 2 'check', field checks.0.left: no earlier step extracts an output 'total'",
    ]


def test_secrets_are_only_typed_into_fields_of_scoped_credentials() -> None:
    doc = document(
        steps=[
            {
                "id": "open",
                "type": "goto",
                "url": "http://127.0.0.1:8001/?q={{ secrets.acme.password }}",
            },
            {
                "id": "user",
                "type": "fill",
                "target": {"label": "User"},
                "value": "{{ secrets.other.username }}",
            },
            {
                "id": "code",
                "type": "fill",
                "target": {"label": "Code"},
                "value": "{{ secrets.acme.token }}",
            },
        ]
    )

    assert messages(doc, credential_kinds={"acme": "username_password", "other": "api_token"}) == [
        "step 1 'open', field url: secrets may only be used as the value of a fill step",
        "step 2 'user', field value: credential 'other' is not among this workflow's credentials",
        "step 3 'code', field value: credential 'acme' has no field 'token' "
        "(it has: username, password)",
    ]


def test_goto_must_stay_inside_the_allowed_hosts() -> None:
    doc = document(
        steps=[
            {"id": "a", "type": "goto", "url": "http://127.0.0.1:8002/"},
            {"id": "b", "type": "goto", "url": "http://169.254.169.254/latest/meta-data"},
            {"id": "c", "type": "goto", "url": "http://{{ params.amount }}/"},
            {"id": "d", "type": "goto", "url": "file:///etc/passwd"},
            {"id": "e", "type": "goto", "url": "http://127.0.0.1:8001/ok"},
        ]
    )

    assert messages(doc) == [
        "step 1 'a', field url: 127.0.0.1:8002 is not in the allowed hosts (127.0.0.1:8001)",
        "step 2 'b', field url: 169.254.169.254 is not in the allowed hosts (127.0.0.1:8001)",
        "step 3 'c', field url: parameters may only be used in the path and query of a URL, "
        "not in its host",
        "step 4 'd', field url: the URL must start with http:// or https://",
    ]


def test_duplicate_step_ids_are_named() -> None:
    doc = document(
        steps=[
            {"id": "a", "type": "goto", "url": "http://127.0.0.1:8001/"},
            {"id": "a", "type": "press", "key": "Enter"},
        ]
    )

    assert messages(doc) == ["step 2 'a', field id: duplicate step id 'a'"]


def test_a_click_that_reads_like_paying_is_flagged_unless_irreversible() -> None:
    doc = document(
        steps=[
            {"id": "pay", "type": "click", "target": {"role": "button", "name": "Submit payment"}},
            {"id": "ok", "type": "click", "irreversible": True, "target": {"text": "Delete"}},
            {"id": "next", "type": "click", "target": {"role": "link", "name": "Next page"}},
        ]
    )

    warnings = irreversible_warnings(list(doc.steps))

    assert [(w.path, w.message.split(" but")[0]) for w in warnings] == [
        (("steps", 0, "irreversible"), "the target reads like 'Submit'")
    ]


def test_a_click_seen_to_only_open_a_dialog_is_not_flagged_while_its_target_stays() -> None:
    delete = {"role": "button", "name": "Delete draft"}
    seen = {"delete": {"target": delete, "dialog": "Delete draft order?", "seen": "#1"}}

    def flagged(target: dict[str, str]) -> list[str]:
        doc = document(steps=[{"id": "delete", "type": "click", "target": target}])
        return [w.message for w in irreversible_warnings(list(doc.steps), seen)]

    assert flagged(delete) == []
    assert flagged({"role": "button", "name": "Delete order"}) != []
    assert (
        irreversible_warnings(
            list(document(steps=[{"id": "delete", "type": "click", "target": delete}]).steps)
        )
        != []
    )


@pytest.mark.parametrize(
    ("parameter", "raw", "expected"),
    [
        ({"type": "money", "currency": "EUR"}, "1,250.00", Decimal("1250.00")),
        ({"type": "number", "minimum": "1"}, "3", Decimal(3)),
        ({"type": "date"}, "2026-11-30", date(2026, 11, 30)),
        ({"type": "enum", "choices": ["a", "b"]}, "b", "b"),
        ({"type": "boolean"}, "yes", True),
        ({"type": "string", "pattern": r"INV-\d{4}"}, "INV-1042", "INV-1042"),
        ({"type": "string", "required": False}, "", None),
        ({"type": "string", "default": "x"}, "", "x"),
    ],
)
def test_parameters_coerce_launch_values(
    parameter: dict[str, Any], raw: str, expected: Any
) -> None:
    assert Parameter.model_validate({"name": "p", **parameter}).coerce(raw) == expected


@pytest.mark.parametrize(
    ("parameter", "raw", "message"),
    [
        ({"type": "money", "currency": "EUR"}, "12.345", "more than 2 decimals"),
        ({"type": "money", "currency": "EUR", "maximum": "100"}, "100.01", "at most 100"),
        ({"type": "number"}, "many", "must be a number"),
        ({"type": "date"}, "30/11/2026", "must be a date"),
        ({"type": "enum", "choices": ["a"]}, "b", "must be one of: a"),
        ({"type": "string", "pattern": r"INV-\d{4}"}, "INV-1", "must match"),
        ({"type": "string"}, "", "is required"),
    ],
)
def test_parameters_refuse_bad_values(parameter: dict[str, Any], raw: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Parameter.model_validate({"name": "p", **parameter}).coerce(raw)


def test_parameter_options_must_fit_the_type() -> None:
    with pytest.raises(ValidationError, match="'choices' does not apply to a string"):
        Parameter.model_validate({"name": "p", "type": "string", "choices": ["a"]})
    with pytest.raises(ValidationError, match="needs a currency"):
        Parameter.model_validate({"name": "p", "type": "money"})
    with pytest.raises(ValidationError, match="is not an amount"):
        Parameter.model_validate({"name": "p", "type": "money", "currency": "EUR", "default": "x"})


def test_references_are_parsed_strictly() -> None:
    assert references("{{ params.a }}-{{secrets.acme.password}}") == [
        ("params", "a", None),
        ("secrets", "acme", "password"),
    ]
    with pytest.raises(ValueError, match="is not a reference"):
        references("{{ os.environ }}")
    with pytest.raises(ValueError, match="unbalanced"):
        references("{{ params.a }")


@pytest.mark.parametrize(
    ("pattern", "host", "port", "allowed"),
    [
        ("portal.example.com", "PORTAL.example.com.", 443, True),
        ("portal.example.com:8443", "portal.example.com", 443, False),
        ("*.example.com", "a.b.example.com", 80, True),
        ("*.example.com", "example.com", 80, False),
        ("*.example.com", "evilexample.com", 80, False),
        ("127.0.0.1:8001", "127.0.0.1", 8001, True),
        ("[::1]:8001", "::1", 8001, True),
    ],
)
def test_host_patterns_match_exactly(pattern: str, host: str, port: int, allowed: bool) -> None:
    assert host_allowed(host, port, [parse_host_pattern(pattern)]) is allowed


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        ("https://portal.example.com", "is a URL"),
        ("portal.*.com", "only a leading"),
        ("*.com", "needs a domain with a dot"),
        ("portal.example.com:99999", "from 1 to 65535"),
        ("::1", "in brackets"),
        ("bad_host!", "not a valid host name"),
    ],
)
def test_bad_host_patterns_are_refused(pattern: str, message: str) -> None:
    with pytest.raises(HostPatternError, match=message):
        parse_host_pattern(pattern)


def test_a_wait_step_pauses_a_fixed_number_of_seconds_and_reads_as_such() -> None:
    step = STEP_ADAPTER.validate_python({"id": "pause", "type": "wait", "seconds": 2.5})

    assert describe_step(step) == "Wait 2.5 seconds"
    one = STEP_ADAPTER.validate_python({"id": "p", "type": "wait", "seconds": 1})
    assert describe_step(one) == "Wait 1 second"
    assert document(
        steps=[
            {"id": "open", "type": "goto", "url": "http://127.0.0.1:8001/login"},
            {"id": "pause", "type": "wait", "seconds": 60},
        ]
    ).steps[1] == STEP_ADAPTER.validate_python({"id": "pause", "type": "wait", "seconds": 60})


@pytest.mark.parametrize("seconds", [0, -1, 60.5, 3600])
def test_it_refuses_a_wait_outside_one_minute(seconds: float) -> None:
    with pytest.raises(ValidationError) as raised:
        STEP_ADAPTER.validate_python({"id": "pause", "type": "wait", "seconds": seconds})

    assert "a wait lasts more than 0 and at most 60 seconds" in str(raised.value)
    assert "wait_for what the page shows" in str(raised.value)


def test_a_typed_username_is_named_but_other_credential_fields_are_a_secret() -> None:
    def sentence(value: str) -> str:
        step = STEP_ADAPTER.validate_python(
            {"id": "f", "type": "fill", "target": {"label": "User"}, "value": value}
        )
        return describe_step(step)

    assert sentence("{{ secrets.acme.username }}") == (
        "Fill the field labelled 'User' with the username of credential 'acme'"
    )
    assert sentence("{{ secrets.acme.password }}").endswith("with a secret")
    assert sentence("{{ secrets.otp.code }}").endswith("with a secret")
    assert sentence("x-{{ secrets.acme.username }}").endswith("with a secret")


def ask(**fields: Any) -> dict[str, Any]:
    return {
        "id": "ask-code",
        "type": "ask",
        "question": "The SMS code?",
        "save_as": "code",
        **fields,
    }


def test_an_ask_step_reads_as_who_is_asked_what() -> None:
    mine = STEP_ADAPTER.validate_python(ask(answer="code"))
    group = STEP_ADAPTER.validate_python(ask(answered_by="Treasury"))

    assert describe_step(mine) == "Ask the person who launched the run: 'The SMS code?'"
    assert describe_step(group) == "Ask Treasury: 'The SMS code?'"
    assert mine.timeout_minutes == 10  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"answer": "choice", "options": ["A"]}, "a choice needs at least two options"),
        ({"answer": "choice", "options": ["Nordwind", "nordwind"]}, "must differ from each other"),
        ({"answer": "code", "options": ["A", "B"]}, "'options' belong to answer: choice"),
        ({"irreversible": True}, "an ask step is never irreversible"),
        ({"answer": "number"}, "'text', 'code' or 'choice'"),
        ({"timeout_minutes": 0}, "greater than or equal to 1"),
        ({"save_as": "SMS code"}, "should match pattern"),
    ],
)
def test_an_ask_step_refuses_what_cannot_be_asked(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        STEP_ADAPTER.validate_python(ask(**fields))


def test_a_one_time_code_is_only_typed_into_a_field() -> None:
    doc = document(
        steps=[
            ask(answer="code"),
            {"id": "type-code", "type": "fill", "target": {"label": "Code"},
             "value": "{{ outputs.code }}"},
            {"id": "open", "type": "goto", "url": "http://127.0.0.1:8001/c/{{ outputs.code }}"},
            {"id": "again", "type": "ask", "question": "Was {{ outputs.code }} right?",
             "save_as": "ok"},
            {"id": "check", "type": "assert",
             "checks": [{"kind": "compare", "left": "outputs.code", "op": "==", "right": "1"}]},
            ask(id="ask-twice", answer="text"),
        ]
    )  # fmt: skip

    assert messages(doc) == [
        "step 3 'open', field url: 'code' is a one-time code: it may only be typed into a field "
        "(the value of a fill step), where it is masked",
        "step 4 'again', field question: 'code' is a one-time code: it may only be typed into a "
        "field (the value of a fill step), where it is masked",
        "step 5 'check', field checks.0.left: 'code' is a one-time code: it cannot be compared",
        "step 6 'ask-twice', field save_as: name 'code' is already used",
    ]


def test_a_text_answer_is_used_like_an_extracted_output() -> None:
    doc = document(
        steps=[
            {"id": "open", "type": "goto", "url": "http://127.0.0.1:8001/"},
            {"id": "pick", "type": "fill", "target": {"label": "Supplier"},
             "value": "{{ outputs.supplier }}"},
            ask(id="which", question="Which supplier?", save_as="supplier", answer="choice",
                options=["Nordwind GmbH", "Nordwind Logistik GmbH"], answered_by="Treasury"),
            {"id": "search", "type": "goto",
             "url": "http://127.0.0.1:8001/suppliers?q={{ outputs.supplier }}"},
            ask(id="who", answered_by="Treasury & Co"),
        ]
    )  # fmt: skip

    assert messages(doc) == [
        "step 2 'pick', field value: no earlier step extracts an output 'supplier'",
        "step 5 'who', field answered_by: answered_by is 'launcher' or the name of a group",
    ]
