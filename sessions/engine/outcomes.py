"""How a portal says no: refusal messages on the page and failed submissions (no Django).

A portal that refuses an action rarely navigates to an error page; it shows a message where the
user is looking. The runner compares what is visible before and after a step: a *new* message is
the portal's answer to that step. Only messages that read as errors count: an ``alert`` role, an
assertive live region or an element whose class says error/danger/invalid — but not one whose
class says success or info (many portals put ``role="alert"`` on "Saved" too), nor a lone
asterisk, nor a control (a red "Cancel order" menu item is something to press, not something the
portal said) — and fields marked ``aria-invalid="true"``, with the message they point to.

A failed submission says no only when the portal answered it with a 4xx. A 5xx (the portal's, or a
gateway's in front of it), an answer the egress proxy wrote itself because the portal did not
answer, and a request that got no answer at all leave it unknown whether the portal acted.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from playwright.sync_api import BrowserContext, Page, Request, Response
from playwright.sync_api import Error as PlaywrightError

from sessions.engine.answers import answer_words, proxy_answer

# The visible refusal messages of a page and of its same-origin frames, outermost element first.
REFUSALS_JS = r"""() => {
  // Class names are read token by token: "errorlist", "has-error", "flash_error" all say error.
  const ERROR = /error|danger|invalid|fail|refused|rejected|denied/i;
  const NOT_ERROR = /success|succeeded|^ok$|info|notice|positive|confirm|hidden|sr-only/i;
  const says = (pattern, classes) => classes.split(/\s+/).some(c => c && pattern.test(c));
  const text = e => (e.innerText || e.textContent || '').replace(/\s+/g, ' ').trim();
  // Controls and what is inside them are there to be pressed: a red "Delete" button or "Cancel
  // order" menu item is styled as a warning, and says nothing about what the portal answered.
  const CONTROL = 'a[href], button, input, select, textarea, summary, option, ' +
    '[contenteditable]:not([contenteditable="false"]), [role="button"], [role="link"], ' +
    '[role="menuitem"], [role="menuitemcheckbox"], [role="menuitemradio"], [role="option"], ' +
    '[role="tab"], [role="checkbox"], [role="radio"], [role="switch"], [role="treeitem"], ' +
    '[role="combobox"], [role="slider"], [role="spinbutton"], [role="menu"], [role="menubar"], ' +
    '[role="listbox"], [role="tablist"], [role="toolbar"]';
  // An element's own words: its text without the controls inside it ("Card declined." from an
  // alert that also holds a "Dismiss" button).
  const words = e => {
    if (!e.querySelector(CONTROL)) return text(e);
    const parts = [];
    const walker = document.createTreeWalker(e, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      if (!node.parentElement.closest(CONTROL)) parts.push(node.textContent);
    }
    return parts.join(' ').replace(/\s+/g, ' ').trim();
  };
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
    if (['FORM', 'BODY', 'HTML'].includes(e.tagName) || e.closest(CONTROL)) continue;
    const classes = (e.getAttribute('class') || '') + ' ' + (e.getAttribute('data-type') || '');
    if (says(NOT_ERROR, classes)) continue;
    const spoken = e.getAttribute('role') === 'alert' ||
      e.getAttribute('aria-live') === 'assertive';
    if (!spoken && !says(ERROR, classes)) continue;
    // A required-field asterisk in an error colour is not a message.
    const message = words(e);
    if ((message.match(/\p{L}/gu) || []).length < 2) continue;
    add(e, message);
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
    """A submission the action started that did not succeed: answered with a 4xx/5xx, or lost."""

    status: int  # 0: no answer reached the browser
    method: str
    url: str
    # An API answer, or an answer the egress proxy wrote itself, read for its words once the
    # listener has returned (reading a body from inside Playwright's event handler would wait on
    # the handler itself). A portal's error page is read from the page instead.
    response: Response | None = None
    # The answer came from the egress proxy: the portal did not answer (it could not be reached,
    # closed the connection or ran out of time).
    by_proxy: bool = False
    # How the request failed when no answer came: Chromium's net::ERR_* code.
    network_error: str = ""

    @property
    def is_refusal(self) -> bool:
        """Whether this is the portal saying no. Only a 4xx is: a 5xx says the server (or a
        gateway in front of it) failed, not whether it acted before failing."""
        return not self.by_proxy and 400 <= self.status < 500

    def describe(self) -> str:
        if self.network_error:
            return f"{self.method} {self.url} got no answer ({self.network_error})"
        words = answer_words(self.response) if self.response is not None else ""
        said = f": {words}" if words else ""
        if self.by_proxy:
            return f"the egress proxy answered HTTP {self.status} to {self.method} {self.url}{said}"
        return f"HTTP {self.status} to {self.method} {self.url}{said}"


@dataclass
class ResponseWatch:
    """The failed answers to submissions started while the watch is on (``with`` block): a
    4xx/5xx, or no answer at all."""

    context: BrowserContext
    failed: list[FailedResponse] = field(default_factory=list)
    _on: bool = False

    def __enter__(self) -> ResponseWatch:
        self._on = True
        self.context.on("response", self._response)
        self.context.on("requestfailed", self._request_failed)
        return self

    def __exit__(self, *exc: object) -> None:
        self._on = False
        for event, listener in (
            ("response", self._response),
            ("requestfailed", self._request_failed),
        ):
            with contextlib.suppress(PlaywrightError, KeyError, ValueError):
                self.context.remove_listener(event, listener)

    @property
    def refusals(self) -> list[FailedResponse]:
        return [f for f in self.failed if f.is_refusal]

    @property
    def unanswered(self) -> list[FailedResponse]:
        """The failures that leave it unknown whether the portal acted."""
        return [f for f in self.failed if not f.is_refusal]

    def _response(self, response: Response) -> None:
        if not self._on or response.status < 400:
            return
        request = response.request
        kind = _submission(request)
        if kind == "" or not _own(request):
            return
        by_proxy = proxy_answer(response)
        self.failed.append(
            FailedResponse(
                status=response.status,
                method=request.method,
                url=response.url,
                response=response if kind == "write" or by_proxy else None,
                by_proxy=by_proxy,
            )
        )

    def _request_failed(self, request: Request) -> None:
        if not self._on or _submission(request) == "" or not _own(request):
            return
        error = request.failure or "net::ERR_FAILED"
        if "ERR_ABORTED" in error:
            # The browser dropped it itself: a newer navigation replaced it, or it became a
            # download. What the portal made of it shows on the page that follows.
            return
        self.failed.append(
            FailedResponse(status=0, method=request.method, url=request.url, network_error=error)
        )


def _own(request: Request) -> bool:
    """Whether ``request`` is the page's own: a navigation of the page, or a call to the site of
    the frame that sent it. A beacon to a tracker the egress proxy cuts off fails as a network
    error, and says nothing about what the portal made of the action."""
    try:
        frame = request.frame
        if request.is_navigation_request() and frame.parent_frame is None:
            return True
        sender = frame.url
    except PlaywrightError:
        return False
    return _site(request.url) == _site(sender)


def _site(url: str) -> str:
    """A host's site, roughly: an address as it is, a name by its last two labels (so
    api.portal.example and www.portal.example are one site; where two labels are too few, as
    in example.co.uk, more counts as the portal's, never less)."""
    host = (urlsplit(url).hostname or "").rstrip(".")
    if not host or ":" in host or host.replace(".", "").isdigit():
        return host
    return ".".join(host.split(".")[-2:])


def _submission(request: Request) -> str:
    """ "load" or "write" for a request that carries a submission, else ""."""
    kind = _SUBMITTING.get(request.resource_type, "")
    if kind == "write" and request.method in _READ_METHODS:
        return ""
    return kind
