"""Refusing the NUL character in any string a request to the API carries.

PostgreSQL cannot store U+0000 in text, so a NUL that got past validation failed as a 500 deep
in a transaction (and on SQLite it was stored and later echoed to other clients). The dashboard's
forms already refuse it; here every JSON body key and value and every query parameter is checked
before any operation sees it, and the answer is a 422 naming the field.
"""

from __future__ import annotations

import json
from typing import Any

from django.http import HttpRequest
from ninja.errors import ValidationError

NUL_MESSAGE = "Null characters are not allowed."


def _nul_paths(value: Any, path: tuple[str, ...]) -> list[tuple[str, ...]]:
    if isinstance(value, str):
        return [path] if "\x00" in value else []
    found: list[tuple[str, ...]] = []
    if isinstance(value, dict):
        for key, item in value.items():
            key_path = (*path, str(key).replace("\x00", "\\u0000"))
            if "\x00" in str(key):
                found.append(key_path)
            found += _nul_paths(item, key_path)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _nul_paths(item, (*path, str(index)))
    return found


def nul_fields(value: Any) -> list[str]:
    """The dotted paths of the strings (keys included) in ``value`` that hold a NUL."""
    return [".".join(path) for path in _nul_paths(value, ())]


def refuse_nul_characters(request: HttpRequest) -> None:
    """Raise a ``ValidationError`` naming each body field and query parameter with a NUL."""
    errors = [
        {"loc": ["query", *path], "msg": NUL_MESSAGE, "type": "null_character"}
        for path in _nul_paths({key: request.GET.getlist(key) for key in request.GET}, ())
    ]
    if request.content_type == "application/json" and request.body:
        try:
            body = json.loads(request.body)
        except ValueError:
            body = None  # the operation's own parser says what is wrong with it
        # from_validation drops the body's second element (the parameter's Python name).
        errors += [
            {"loc": ["body", "", *path], "msg": NUL_MESSAGE, "type": "null_character"}
            for path in _nul_paths(body, ())
        ]
    if errors:
        raise ValidationError(errors)
