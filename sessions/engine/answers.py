"""What an HTTP answer says: whether the egress proxy wrote it, and the short message in its body.
Free of Playwright's import (``browser_errors``): the goto step's module uses it."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from sessions.engine.browser_errors import BrowserError
from sessions.engine.proxy import PROXY_ANSWER_HEADER

if TYPE_CHECKING:
    from playwright.sync_api import Response


def proxy_answer(response: Response) -> bool:
    """Whether the egress proxy wrote ``response`` itself because the portal did not answer."""
    try:
        return bool(response.headers.get(PROXY_ANSWER_HEADER.lower()))
    except BrowserError:
        return False


def answer_words(response: Response) -> str:
    """A short error message from an API answer: JSON ``message``/``detail``/``error``, or
    plain text."""
    try:
        content_type = response.headers.get("content-type", "")
        body = response.text()
    except BrowserError:
        return ""
    if "json" in content_type:
        try:
            data: Any = json.loads(body)
        except ValueError:
            return ""
        if isinstance(data, dict):
            for key in ("message", "detail", "error", "title"):
                value = data.get(key)
                if isinstance(value, str) and value.strip():
                    return " ".join(value.split())[:300]
        return ""
    if content_type.startswith("text/plain"):
        return " ".join(body.split())[:300]
    return ""
