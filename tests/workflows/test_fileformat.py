from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from workflows.fileformat import DocumentError, dump_document, load_document
from workflows.schema import (
    STEP_TYPES,
    WorkflowDocument,
    describe_step,
    document_problems,
    irreversible_warnings,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "workflows" / "examples" / "acme-pay-invoice.yaml"


def problems_of(text: str) -> list[str]:
    with pytest.raises(DocumentError) as caught:
        load_document(text)
    return [str(p) for p in caught.value.problems]


def test_the_demo_workflow_is_valid_and_uses_most_step_types() -> None:
    document = load_document(EXAMPLE.read_text())

    assert document_problems(document, credential_kinds={"acme-portal": "username_password"}) == []
    used = {step.type for step in document.steps}
    assert len(used) >= 9
    assert [describe_step(s) for s in document.steps if s.irreversible] == [
        "Click the button 'Submit payment' — irreversible"
    ]


@pytest.mark.parametrize("path", sorted(EXAMPLE.parent.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_bundled_example_publishes_without_problems_or_warnings(path: Path) -> None:
    # manage.py demo_workflow publishes them without accepting warnings.
    document = load_document(path.read_text())

    assert document_problems(document, credential_kinds={"acme-portal": "username_password"}) == []
    assert irreversible_warnings(list(document.steps)) == []


def test_the_demo_file_is_already_in_canonical_form() -> None:
    text = EXAMPLE.read_text()

    assert dump_document(load_document(text)) == yaml.safe_dump(
        yaml.safe_load(text), sort_keys=False, allow_unicode=True, width=100
    )


@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_round_trips_are_exact(fmt: str) -> None:
    document = load_document(EXAMPLE.read_text())

    text = dump_document(document, fmt)  # type: ignore[arg-type]
    again = load_document(text)

    assert again == document
    assert dump_document(again, fmt) == text  # type: ignore[arg-type]
    if fmt == "json":
        assert json.loads(text)["pandaweb"] == 1


def test_a_malformed_file_names_the_line() -> None:
    assert problems_of("pandaweb: 1\nname: [unclosed\n") == [
        "line 3, file: not valid YAML: expected ',' or ']', but got '<stream end>'"
    ]


def test_an_unknown_step_type_names_line_step_and_type() -> None:
    text = EXAMPLE.read_text() + ("- id: hover-menu\n  type: hover\n  target:\n    text: Menu\n")
    lines = text.splitlines()

    (problem,) = problems_of(text)

    assert problem.startswith(f"line {len(lines) - 3}, step 18 'hover-menu': unknown type 'hover'")


def test_every_bad_field_is_reported_with_its_line() -> None:
    text = (
        "pandaweb: 1\nname: X\nslug: Not A Slug\nsettings:\n  allowed_hosts: [portal.example.com]\n"
        "steps:\n- id: go\n  type: goto\n  url: https://portal.example.com/\n  colour: red\n"
        "- id: click\n  type: click\n  target: {role: buton, name: Pay}\n"
    )

    assert problems_of(text) == [
        "line 3, slug: String should match pattern '^[a-z0-9][a-z0-9-]{0,62}$'",
        "line 10, step 1 'go', field colour: is not a known field",
        "line 13, step 2 'click', field target.role: Input should be 'alert', 'button', 'cell', "
        "'checkbox', 'columnheader', 'combobox', 'dialog', 'gridcell', 'heading', 'img', 'link', "
        "'listbox', 'listitem', 'menu', 'menuitem', 'navigation', 'option', 'radio', 'region', "
        "'row', 'rowheader', 'searchbox', 'slider', 'spinbutton', 'switch', 'tab', 'table', "
        "'tabpanel', 'textbox', 'tree' or 'treeitem'",
    ]


def test_it_refuses_aliases_that_could_expand_the_file() -> None:
    text = "pandaweb: 1\nname: &n X\nslug: x\ndescription: *n\n"

    assert problems_of(text) == [
        "line 2, file: YAML anchors and aliases (&name / *name) are not allowed in workflow files"
    ]


def test_it_refuses_files_that_are_not_workflows() -> None:
    assert problems_of("") == ["file: the file is empty"]
    assert problems_of("- a\n- b\n") == [
        "file: the file must be a mapping with keys pandaweb, name, slug, steps…"
    ]
    assert problems_of("pandaweb: 2\n") == [
        "line 1, pandaweb: this is not a pandaweb workflow file of format 1 "
        "(expected a first line 'pandaweb: 1')"
    ]
    with pytest.raises(DocumentError, match="not UTF-8"):
        load_document(b"pandaweb: 1\nname: \xff\n")


def test_python_objects_in_yaml_are_not_constructed() -> None:
    problems = problems_of("pandaweb: 1\nname: !!python/object/apply:os.system ['true']\n")

    assert "could not determine a constructor" in problems[0]


yaml_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 100),
    st.text(max_size=12),
    st.sampled_from(STEP_TYPES),
)
yaml_values = st.recursive(
    yaml_scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(
            st.sampled_from(
                [
                    "id",
                    "type",
                    "target",
                    "role",
                    "name",
                    "label",
                    "url",
                    "value",
                    "steps",
                    "fields",
                    "kind",
                    "checks",
                    "settings",
                    "allowed_hosts",
                    "parameters",
                    "slug",
                    "x",
                ]
            ),
            children,
            max_size=5,
        ),
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(
    body=st.dictionaries(
        st.sampled_from(["name", "slug", "settings", "steps", "parameters", "x"]),
        yaml_values,
        max_size=6,
    )
)
def test_the_loader_never_crashes_on_structured_junk(body: dict[str, object]) -> None:
    text = yaml.safe_dump({"pandaweb": 1, **body})
    try:
        document = load_document(text)
    except DocumentError as exc:
        assert exc.problems
        assert all(p.message for p in exc.problems)
    else:
        assert isinstance(document, WorkflowDocument)


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=300))
def test_the_loader_never_crashes_on_arbitrary_text(text: str) -> None:
    try:
        load_document("pandaweb: 1\n" + text)
    except DocumentError as exc:
        assert exc.problems
