"""Reading and writing workflow files (YAML or JSON), with errors that name line, step and field.

No Django imports. Reading never executes anything from the file: YAML is composed with the safe
loader, aliases are refused (they let a small file expand into a huge document), and the result
goes through the strict schema before anything else sees it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

import yaml
from pydantic import ValidationError

from sessions.engine.steps.assertion import CHECK_KINDS
from sessions.engine.steps.base import Problem
from workflows.schema import FORMAT_VERSION, STEP_TYPES, WorkflowDocument

MAX_FILE_BYTES = 1_000_000
MAX_NODES = 50_000
# A workflow is a few levels deep; YAML's composer recurses once per level, so a file nested
# thousands deep would exhaust the interpreter's stack before any rule could refuse it.
MAX_DEPTH = 40


@dataclass(frozen=True)
class LocatedProblem:
    where: str
    message: str
    line: int | None
    # The keys and list indexes down to the value at fault (empty when it is the whole file):
    # what a program needs to point at it, where people read ``where``.
    path: tuple[str | int, ...] = ()

    def __str__(self) -> str:
        at = f"line {self.line}, " if self.line else ""
        return f"{at}{self.where}: {self.message}"


class DocumentError(ValueError):
    """The file cannot become a workflow; ``problems`` says every reason found."""

    def __init__(self, problems: list[LocatedProblem]) -> None:
        self.problems = problems
        super().__init__("; ".join(str(p) for p in problems))


def load_document(text: str | bytes) -> WorkflowDocument:
    """Parse and validate a workflow file. Raises DocumentError; never anything else."""
    if isinstance(text, bytes):
        if len(text) > MAX_FILE_BYTES:
            raise _single("file", f"the file is larger than {MAX_FILE_BYTES // 1000} kB")
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _single("file", f"the file is not UTF-8 text (byte {exc.start})") from None
    if len(text) > MAX_FILE_BYTES:
        raise _single("file", f"the file is larger than {MAX_FILE_BYTES // 1000} kB")
    root, data = _parse(text)
    if not isinstance(data, dict):
        raise _single("file", "the file must be a mapping with keys pandaweb, name, slug, steps…")
    if data.get("pandaweb") != FORMAT_VERSION:
        raise _single(
            "pandaweb",
            f"this is not a pandaweb workflow file of format {FORMAT_VERSION} "
            f"(expected a first line 'pandaweb: {FORMAT_VERSION}')",
            line=_line_of(root, ("pandaweb",)) or 1,
        )
    nul_problems = _null_characters(root, data)
    if nul_problems:
        raise DocumentError(nul_problems)
    try:
        return WorkflowDocument.model_validate(data)
    except ValidationError as exc:
        raise DocumentError(_located(exc, root, data)) from None


def _nul_paths(value: Any, path: tuple[str | int, ...]) -> list[tuple[str | int, ...]]:
    if isinstance(value, str):
        return [path] if "\x00" in value else []
    found: list[tuple[str | int, ...]] = []
    if isinstance(value, dict):
        for key, item in value.items():
            found += [(*path, str(key))] if "\x00" in str(key) else []
            found += _nul_paths(item, (*path, str(key)))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _nul_paths(item, (*path, index))
    return found


def _null_characters(root: yaml.Node | None, data: dict[str, Any]) -> list[LocatedProblem]:
    """A NUL anywhere in the file, named where it is: the database cannot store one, so it
    would otherwise fail the save after every other check passed."""
    steps = data.get("steps") if isinstance(data.get("steps"), list) else []
    session = data.get("session")
    session_steps = session.get("steps") if isinstance(session, dict) else None
    return [
        LocatedProblem(
            where=Problem(path=path, message="").where(
                steps, session_steps=session_steps if isinstance(session_steps, list) else None
            ),
            message="null characters are not allowed",
            line=_line_of(root, path),
            path=path,
        )
        for path in _nul_paths(data, ())
    ]


def locate(
    problems: list[Problem], text: str, steps: list[Any], session_steps: list[Any] | None = None
) -> list[LocatedProblem]:
    """Attach line numbers from the original file to problems found on its document."""
    root, _ = _parse(text)
    return [
        LocatedProblem(
            where=p.where(steps, session_steps=session_steps),
            message=p.message,
            line=_line_of(root, p.path),
            path=p.path,
        )
        for p in problems
    ]


def dump_document(document: WorkflowDocument, fmt: Literal["yaml", "json"] = "yaml") -> str:
    """The canonical text of a document: defaults left out, keys in a stable, readable order."""
    data = canonical_data(document)
    if fmt == "json":
        return json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=100)


def canonical_data(document: WorkflowDocument) -> dict[str, Any]:
    body = document.model_dump(mode="json", exclude_defaults=True, exclude={"pandaweb"})
    body["steps"] = _steps_first_id_type(body.get("steps", []))
    if "session" in body:
        body["session"]["steps"] = _steps_first_id_type(body["session"]["steps"])
    return {"pandaweb": FORMAT_VERSION, **body}


def _steps_first_id_type(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"id": step.pop("id"), "type": step.pop("type"), **step} for step in steps]


def _single(where: str, message: str, line: int | None = None) -> DocumentError:
    """One problem: of the whole ``file``, or of the top-level key ``where`` names."""
    path = () if where == "file" else (where,)
    return DocumentError([LocatedProblem(where=where, message=message, line=line, path=path)])


def _parse(text: str) -> tuple[yaml.Node | None, Any]:
    """Compose the YAML (JSON is YAML) and build plain data from the node tree."""
    try:
        _refuse_deep_nesting(text)
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        raise _single("file", f"not valid YAML: {exc.problem or exc}", line=line) from None
    except yaml.YAMLError as exc:
        raise _single("file", f"not valid YAML: {exc}") from None
    if root is None:
        raise _single("file", "the file is empty")
    _refuse_aliases(root)
    try:
        data = yaml.SafeLoader(text).construct_document(root)
    except yaml.YAMLError as exc:
        raise _single("file", f"not valid YAML: {exc}") from None
    except (TypeError, ValueError) as exc:  # e.g. an unhashable mapping key
        raise _single("file", f"not valid YAML: {exc}") from None
    return root, data


def _refuse_deep_nesting(text: str) -> None:
    """Refuse a file nested deeper than MAX_DEPTH, reading its events (which does not recurse)."""
    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                line = event.start_mark.line + 1 if event.start_mark else None
                raise _single(
                    "file", f"the file is nested more than {MAX_DEPTH} levels deep", line=line
                )
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def _refuse_aliases(root: yaml.Node) -> None:
    seen: set[int] = set()
    stack = [root]
    count = 0
    while stack:
        node = stack.pop()
        count += 1
        if count > MAX_NODES:
            raise _single("file", "the file is too large or too deeply nested")
        if id(node) in seen:
            raise _single(
                "file",
                "YAML anchors and aliases (&name / *name) are not allowed in workflow files",
                line=node.start_mark.line + 1,
            )
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                stack += [key, value]
        elif isinstance(node, yaml.SequenceNode):
            stack += list(node.value)


def _line_of(root: yaml.Node | None, path: tuple[str | int, ...]) -> int | None:
    """The line of the deepest node of ``path`` present in the file (1-based)."""
    node = root
    line = node.start_mark.line + 1 if node is not None else None
    for part in path:
        child = None
        if isinstance(node, yaml.MappingNode) and isinstance(part, str):
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode) and key.value == part:
                    child = value
                    line = key.start_mark.line + 1
                    break
        elif (
            isinstance(node, yaml.SequenceNode)
            and isinstance(part, int)
            and 0 <= part < len(node.value)
        ):
            child = node.value[part]
            line = child.start_mark.line + 1
        if child is None:
            # Pydantic adds the union tag (e.g. 'click') to error paths; it is not in the file.
            continue
        node = child
    return line


def _located(
    exc: ValidationError, root: yaml.Node | None, data: dict[str, Any]
) -> list[LocatedProblem]:
    problems = []
    steps = data.get("steps") if isinstance(data.get("steps"), list) else []
    session = data.get("session")
    session_steps = session.get("steps") if isinstance(session, dict) else None
    for error in exc.errors(include_url=False, include_input=False):
        path = tuple(error["loc"])
        message = _message(error)
        problem = Problem(path=_file_path(path, data), message=message)
        problems.append(
            LocatedProblem(
                where=problem.where(
                    steps, session_steps=session_steps if isinstance(session_steps, list) else None
                ),
                message=message,
                line=_line_of(root, problem.path),
                path=problem.path,
            )
        )
    return problems


def _file_path(path: tuple[Any, ...], data: Any) -> tuple[str | int, ...]:
    """Drop the parts pydantic adds that are not keys in the file (union tags, validators)."""
    result: list[str | int] = []
    node = data
    for part in path:
        in_dict = isinstance(node, dict) and part in node
        in_list = isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)
        if in_dict or in_list:
            result.append(part)
            node = node[part]
        elif (
            isinstance(node, dict)
            and isinstance(part, str)
            and not part.startswith(("function-", "tagged-"))
            and part not in _UNION_TAGS
        ):
            result.append(part)  # a missing key: name it
            node = None
    return tuple(result)


# The discriminator values pydantic puts in an error's location (not a key of the document).
_UNION_TAGS = frozenset((*STEP_TYPES, *CHECK_KINDS))


def _message(error: Any) -> str:
    kind = error["type"]
    if kind == "missing":
        return "is required"
    if kind == "extra_forbidden":
        return "is not a known field"
    if kind == "union_tag_invalid":
        return f"unknown type {error.get('ctx', {}).get('tag', '')!r}; expected one of: " + str(
            error.get("ctx", {}).get("expected_tags", "")
        )
    if kind == "union_tag_not_found":
        return "needs a 'type' (e.g. type: click)"
    message = str(error["msg"])
    return message.removeprefix("Value error, ")
