"""How a portal says no: refusal messages on the page and failed submissions (no Django).

A portal that refuses an action rarely navigates to an error page; it shows a message where the
user is looking. The runner compares what is visible before and after a step: a *new* message is
the portal's answer to that step. Only messages that read as errors count: an ``alert`` role, an
assertive live region or an element whose class says error/danger/invalid — but not one whose
class says success or info (many portals put ``role="alert"`` on "Saved" too), nor a lone
asterisk — and fields marked ``aria-invalid="true"``, with the message they point to.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from typing import Any

from playwright.sync_api import BrowserContext, Page, Response
from playwright.sync_api import Error as PlaywrightError

# The visible refusal messages of a page and of its same-origin frames, outermost element first.
REFUSALS_JS = r"""() => {
  // Class names are read token by token: "errorlist", "has-error", "flash_error" all say error.
  const ERROR = /error|danger|invalid|fail|refused|rejected|denied/i;
  const NOT_ERROR = /success|succeeded|^ok$|info|notice|positive|confirm|hidden|sr-only/i;
  const says = (pattern, classes) => classes.split(/\s+/).some(c => c && pattern.test(c));
  const text = e => (e.innerText || e.textContent || '').replace(/\s+/g, ' ').trim();
  const visible = e => {
    const box = e.getBoundingClientRect();
    const style = getComputedStyle(e);
    return box.width > 0 && box.height > 0 && style.visibility !== 'hidden' &&
      style.display !== 'none';
  };
  const out = [];
  const taken = [];
  const add = (e, message) => {
    message = message.slice(0, 500);
    if (message && !out.includes(message)) { out.push(message); taken.push(e); }
  };
  const selector = '[role="alert"], [aria-live="assertive"], [aria-invalid="true"], ' +
    '[class*="error" i], [class*="danger" i], [class*="invalid" i], [class*="fail" i]';
  for (const e of document.querySelectorAll(selector)) {
    if (!visible(e) || taken.some(t => t.contains(e))) continue;
    if (e.getAttribute('aria-invalid') === 'true') {
      if (!['INPUT', 'SELECT', 'TEXTAREA'].includes(e.tagName) && !e.isContentEditable) continue;
      const ids = (e.getAttribute('aria-errormessage') || e.getAttribute('aria-describedby') || '')
        .split(/\s+/).filter(Boolean);
      const refs = ids.map(id => document.getElementById(id)).filter(Boolean);
      const said = refs.map(text).join(' ');
      taken.push(...refs);  // said once, with the field's name
      const label = (e.labels && e.labels.length ? text(e.labels[0]) : '') ||
        e.getAttribute('aria-label') || e.getAttribute('name') || 'a field';
      add(e, `${label}: ${said || e.validationMessage || 'marked invalid'}`);
      continue;
    }
    const TAGS = ['INPUT', 'SELECT', 'TEXTAREA', 'BUTTON', 'FORM', 'BODY', 'HTML'];
    if (TAGS.includes(e.tagName)) continue;
    const classes = (e.getAttribute('class') || '') + ' ' + (e.getAttribute('data-type') || '');
    if (says(NOT_ERROR, classes)) continue;
    const spoken = e.getAttribute('role') === 'alert' ||
      e.getAttribute('aria-live') === 'assertive';
    if (!spoken && !says(ERROR, classes)) continue;
    // A required-field asterisk in an error colour is not a message.
    if ((text(e).match(/\p{L}/gu) || []).length < 2) continue;
    add(e, text(e));
  }
  return out;
}"""

# Requests that carry a submission: a page load, or a script's call that changes something.
_SUBMITTING = {"document": "load", "fetch": "write", "xhr": "write"}
_READ_METHODS = {"GET", "HEAD", "OPTIONS"}


def visible_refusals(page: Page) -> list[str]:
    """The refusal messages ``page`` shows now ([] when it cannot tell, e.g. mid-navigation)."""
    messages: list[str] = []
    for frame in page.frames:
        try:
            found = frame.evaluate(REFUSALS_JS)
        except PlaywrightError:
            continue
        messages += [str(m) for m in found if str(m) not in messages]
    return messages


@dataclass
class FailedResponse:
    status: int
    method: str
    url: str
    # An API answer, read for its words once the listener has returned (reading a body from
    # inside Playwright's event handler would wait on the handler itself).
    response: Response | None = None

    def describe(self) -> str:
        words = _words(self.response) if self.response is not None else ""
        said = f": {words}" if words else ""
        return f"HTTP {self.status} to {self.method} {self.url}{said}"


@dataclass
class ResponseWatch:
    """The 4xx/5xx answers to submissions started while the watch is on (``with`` block)."""

    context: BrowserContext
    failed: list[FailedResponse] = field(default_factory=list)
    _on: bool = False

    def __enter__(self) -> ResponseWatch:
        self._on = True
        self.context.on("response", self._response)
        return self

    def __exit__(self, *exc: object) -> None:
        self._on = False
        with contextlib.suppress(PlaywrightError, KeyError, ValueError):
            self.context.remove_listener("response", self._response)

    def _response(self, response: Response) -> None:
        if not self._on or response.status < 400:
            return
        request = response.request
        kind = _SUBMITTING.get(request.resource_type, "")
        if kind == "" or (kind == "write" and request.method in _READ_METHODS):
            return
        self.failed.append(
            FailedResponse(
                status=response.status,
                method=request.method,
                url=response.url,
                response=response if kind == "write" else None,
            )
        )


def _words(response: Response) -> str:
    """A short error message from an API answer: JSON ``message``/``detail``/``error``, or
    plain text."""
    try:
        content_type = response.headers.get("content-type", "")
        body = response.text()
    except PlaywrightError:
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
