"""A workflow version's parameters as a JSON Schema (draft 2020-12) object (no Django imports).

The schema describes what the launch endpoint accepts in ``inputs``; the launch itself validates
with ``Parameter.coerce``, the same code as the launch form, so the two cannot disagree on a value
the schema admits. Bounds of money, numbers and dates are exact decimal or ISO strings, so they are
given as ``x-minimum`` / ``x-maximum`` strings (JSON numbers would round them) and, for numbers,
also as ``minimum`` / ``maximum``.
"""

from __future__ import annotations

from typing import Any

from workflows.schema import Parameter

MONEY_PATTERN = r"^-?[0-9][0-9,]*(\.[0-9]{1,2})?$"


def parameter_schema(parameter: Parameter) -> dict[str, Any]:
    schema: dict[str, Any] = {}
    if parameter.label:
        schema["title"] = parameter.label
    if parameter.help:
        schema["description"] = parameter.help
    if parameter.type == "string":
        schema["type"] = "string"
        if parameter.min_length is not None:
            schema["minLength"] = parameter.min_length
        if parameter.max_length is not None:
            schema["maxLength"] = parameter.max_length
        if parameter.pattern is not None:
            # The launch matches the whole value (re.fullmatch); JSON Schema searches.
            schema["pattern"] = f"^(?:{parameter.pattern})$"
    elif parameter.type == "enum":
        schema["type"] = "string"
        schema["enum"] = list(parameter.choices or [])
    elif parameter.type == "boolean":
        schema["type"] = "boolean"
    elif parameter.type == "date":
        schema["type"] = "string"
        schema["format"] = "date"
    elif parameter.type == "money":
        schema["type"] = "string"
        schema["pattern"] = MONEY_PATTERN
        schema["x-currency"] = parameter.currency
        schema["examples"] = ["1250.00"]
    else:  # number
        schema["type"] = ["number", "string"]
        if parameter.minimum is not None:
            schema["minimum"] = float(parameter.minimum)
        if parameter.maximum is not None:
            schema["maximum"] = float(parameter.maximum)
    if parameter.type in {"number", "money", "date"}:
        if parameter.minimum is not None:
            schema["x-minimum"] = parameter.minimum
        if parameter.maximum is not None:
            schema["x-maximum"] = parameter.maximum
    if parameter.default is not None:
        schema["default"] = parameter.default
    if not parameter.required and parameter.default is None:
        schema = {"anyOf": [schema, {"type": "null"}], **_annotations(schema)}
    return schema


def _annotations(schema: dict[str, Any]) -> dict[str, Any]:
    return {k: schema[k] for k in ("title", "description") if k in schema}


def parameters_schema(parameters: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``inputs`` object of a launch: one property per parameter, nothing else."""
    properties: dict[str, Any] = {}
    required: list[str] = []
    for data in parameters:
        parameter = Parameter.model_validate(data)
        properties[parameter.name] = parameter_schema(parameter)
        if parameter.required and parameter.default is None:
            required.append(parameter.name)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }
