"""What the robot saw: a compact, numbered list of a page's controls, taken from the page.

No Django imports. The runner takes a page's state with ``take`` (cheap, at the instant a step
ends) and the run's writer builds the numbered ``Observation`` from it later, off the runner's path.

Taking is one ``Runtime.evaluate`` of an in-page serialiser (``observation.js``) in the isolated
world that also holds the page's change counter (``PageWatch``): it walks the DOM, open shadow roots
and same-origin iframes in document order and returns, as one JSON string, a tree of the elements a
person reads or acts on, with roles and names computed the way accessibility tools do, their states,
values and boxes, the texts between them, and the values of password inputs. The page's own scripts
cannot see that world. What it leaves out is said: the content of a cross-origin iframe is not
walked, and the observation has a line saying so.

Which elements are kept, and how secrets are redacted from them, is ``sessions.engine.reading``;
the pictures drawn from a step's screenshot are ``sessions.engine.pictures``. Every interactive
element's ``ref`` is a Playwright selector that addresses it (``page.locator(ref)``):
``nth-child`` steps from its document, through shadow hosts and into iframes, valid for the page
as it was taken.

Secrets: the value of a password input is a secret. Every such value and every caller-supplied
secret is redacted from names, values, the URL and the title before anything is rendered, so
neither ``text`` nor ``to_dict()`` can carry one, and every field showing one is masked in the
screenshot. Password inputs are found by code in the page, which a hostile page can fool;
``secret_values`` (what the runner typed) is the defence that holds.
"""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import json
import math
import threading
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import Locator, Page

from sessions.engine.aria_snapshot import SnapshotNode
from sessions.engine.frames import FramePump, FramesError
from sessions.engine.reading import (
    GROUP_ROLES,
    MESSAGE_ROLES,
    OPTIONS_SHOWN,
    Box,
    Builder,
    Redactor,
    is_landmark,
)
from sessions.engine.screencast import mask_frame


@dataclass(frozen=True)
class Element:
    """One line of the observation.

    ``number`` runs 1..N over all elements in document order; only interactive elements carry a
    box and show their number in ``Observation.text`` (and on the overlay).
    """

    number: int
    ref: str | None
    role: str
    name: str
    state: tuple[str, ...] = ()
    value: str | None = None
    level: int | None = None
    frame: str | None = None
    box: Box | None = None
    interactive: bool = False
    options: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "ref": self.ref,
            "role": self.role,
            "name": self.name,
            "state": list(self.state),
            "value": self.value,
            "level": self.level,
            "frame": self.frame,
            "box": None if self.box is None else self.box._asdict(),
            "interactive": self.interactive,
            "options": list(self.options),
        }

    def render(self) -> str:
        label = f'{self.role} "{_quote(self.name)}"' if self.name else self.role
        if self.interactive:
            line = f"[{self.number}] {label}"
            if self.value is not None:
                line += f' = "{_quote(self.value)}"'
            if self.options:
                shown = " | ".join(_quote(option) for option in self.options[:OPTIONS_SHOWN])
                more = len(self.options) - OPTIONS_SHOWN
                line += f" {{{shown}{f' …+{more}' if more > 0 else ''}}}"
            if self.state:
                line += f" ({', '.join(self.state)})"
            return line
        if self.role == "heading":
            return f"## {label}" + (f" (level {self.level})" if self.level else "")
        if self.role in MESSAGE_ROLES:
            return f"! {label}"
        if self.role == "text":
            return f"text: {self.name}"
        if self.role in GROUP_ROLES:
            return f"~ {label}"
        return f"-- {label}"


@dataclass(frozen=True)
class Observation:
    url: str
    title: str
    elements: tuple[Element, ...]
    text: str
    omitted: int = 0
    size_chars: int = field(init=False)
    token_estimate: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "size_chars", len(self.text))
        object.__setattr__(self, "token_estimate", math.ceil(len(self.text) / 4))

    def element(self, number: int) -> Element:
        for element in self.elements:
            if element.number == number:
                return element
        raise KeyError(number)

    def to_dict(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "title": self.title,
            "text": self.text,
            "size_chars": self.size_chars,
            "token_estimate": self.token_estimate,
            "omitted": self.omitted,
            "elements": [element.to_dict() for element in self.elements],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False)


def _quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


@dataclass(frozen=True)
class Capture:
    """An observation plus what the runner needs to picture the same moment.

    ``masks`` are the inputs to hide in a screenshot taken right after.
    """

    observation: Observation
    masks: list[Locator]


def observe(
    page: Page, *, secret_values: Collection[str] = (), max_elements: int | None = None
) -> Observation:
    """Observe ``page``: its controls, headings, landmarks and messages, numbered 1..N.

    Complete by default: stored evidence must address every element. With ``max_elements``
    (for what a model reads), elements past it in document order are left out, counted in
    ``omitted`` and said so on the last line. Read-only: nothing on the page is clicked, typed or
    scrolled.
    """
    return capture(page, secret_values=secret_values, max_elements=max_elements).observation


def capture(
    page: Page, *, secret_values: Collection[str] = (), max_elements: int | None = None
) -> Capture:
    """``observe`` plus the screenshot masks, built now."""
    taken = take(page, secret_values=secret_values, max_elements=max_elements)
    return Capture(observation=taken.build(), masks=taken.masks)


@dataclass(eq=False)
class Snapshot:
    """What a page showed at one instant, taken cheaply, to be built into an ``Observation``
    later and elsewhere (the run's writer thread) with ``build()``, which needs no page.

    Everything that depends on the instant is read here: the serialised page (``raw``, JSON with
    the URL and title), the password values (for redaction) and ``masks``, the inputs to paint
    over in a screenshot taken right after.
    """

    url: str
    title: str
    raw: str
    secrets: frozenset[str]
    masks: list[Locator]
    # The serialiser's selectors of the main frame's fields among ``masks``.
    mask_paths: tuple[str, ...] = ()
    max_elements: int | None = None
    _built: Observation | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def shown_title(self) -> str:
        return Redactor(self.secrets).text(self.title)

    @property
    def key(self) -> str:
        """Equal for two snapshots of the same URL, controls, texts and layout."""
        return self.raw

    def build(self) -> Observation:
        """The numbered observation (built once; later calls return the same one)."""
        with self._lock:
            if self._built is None:
                self._built = _build(self)
            return self._built


def take(
    page: Page,
    *,
    secret_values: Collection[str] = (),
    max_elements: int | None = None,
    watch: PageWatch | None = None,
) -> Snapshot:
    """Read what must be read at this instant; leave the numbering and rendering for later.

    Costs one ``Runtime.evaluate`` in ``watch``'s isolated world (a ``PageWatch`` of ``page``;
    without one, a world is made for this call: two round trips more). Every field whose value
    or name holds a secret is masked, and every password input of every frame, cross-origin ones
    included.
    """
    if watch is None or watch.page is not page:
        with contextlib.closing(PageWatch(page)) as once:
            return _take(page, once, secret_values, max_elements)
    return _take(page, watch, secret_values, max_elements)


def _take(
    page: Page, watch: PageWatch, secret_values: Collection[str], max_elements: int | None
) -> Snapshot:
    raw = watch.evaluate(_SERIALISE)
    taken = json.loads(raw)
    if taken["url"] != page.url:
        # A world left from the document before (kept in the back/forward cache, say).
        raw = watch.evaluate(_SERIALISE, fresh=True)
        taken = json.loads(raw)
    passwords = taken["passwords"]
    every_secret = frozenset(
        {*(secret for secret in secret_values if secret), *(value for _, value in passwords)}
    )
    # Only what must be hidden: a mask makes the screenshot change the page (Playwright draws
    # it in), which the change counter then sees.
    selectors = _Selectors(taken["steps"])
    mask_paths = [selectors[ref] for ref, _ in passwords]
    opaque_masks = []
    if taken["opaque_frames"]:
        # A cross-origin frame's inputs are out of the serialiser's reach: mask them unseen.
        opaque_masks = [
            frame.locator("input[type=password], input[autocomplete=one-time-code]")
            for frame in page.frames[1:]
        ]
    if every_secret:
        redactor = Redactor(every_secret)
        mask_paths += [selectors[ref] for ref in _refs_touching(taken["nodes"], redactor)]
    masks = [page.locator(path) for path in mask_paths] + opaque_masks
    return Snapshot(
        url=str(taken["url"]),
        title=str(taken["title"]),
        raw=raw,
        secrets=every_secret,
        masks=masks,
        mask_paths=tuple(mask_paths),
        max_elements=max_elements,
    )


class _Selectors:
    """The serialiser's table of steps, read as Playwright selectors (each built once)."""

    def __init__(self, steps: list[list[Any]]) -> None:
        self.steps = steps
        self.built: dict[int, str] = {}

    def __getitem__(self, row: int) -> str:
        selector = self.built.get(row)
        if selector is None:
            parent, step = self.steps[row]
            selector = self.built[row] = step if parent < 0 else self[parent] + step
        return selector


def _refs_touching(nodes: list[Any], redactor: Redactor) -> Iterator[int]:
    """Refs of serialised nodes whose name or value holds a secret: the builder masks those
    values, and the screenshot must not show them either."""
    for node in nodes:
        if isinstance(node, str):
            continue
        _, name, attrs, text, _, children = node
        ref = attrs.get("ref")
        if ref is not None and (
            redactor.touches(name) or (text is not None and redactor.touches(text))
        ):
            yield ref
        yield from _refs_touching(children, redactor)


def _tree(nodes: list[Any], selectors: _Selectors) -> list[SnapshotNode]:
    """The serialiser's nested lists as snapshot nodes (a text is a node of role ``text``)."""
    tree: list[SnapshotNode] = []
    for node in nodes:
        if isinstance(node, str):
            tree.append(SnapshotNode(role="text", text=node))
            continue
        role, name, attrs, text, props, children = node
        if "ref" in attrs:
            attrs["ref"] = selectors[attrs["ref"]]
        tree.append(
            SnapshotNode(
                role=role,
                name=name,
                attrs=attrs,
                text=text,
                props=props,
                children=_tree(children, selectors),
            )
        )
    return tree


def _build(taken: Snapshot) -> Observation:
    redactor = Redactor(taken.secrets)
    builder = Builder(redactor)
    serialised = json.loads(taken.raw)
    for root in _tree(serialised["nodes"], _Selectors(serialised["steps"])):
        builder.visit(root)
    items = builder.items

    # Landmarks (and iframes) earn a line only when something kept lies inside them.
    used: set[int] = set()
    for item in items:
        if not is_landmark(item):
            used.update(id(landmark) for landmark in item.landmarks)
    kept = [item for item in items if not is_landmark(item) or id(item) in used]

    max_elements = taken.max_elements
    omitted = 0 if max_elements is None else max(0, len(kept) - max_elements)
    if max_elements is not None:
        kept = kept[:max_elements]
    elements = tuple(
        Element(
            number=number,
            ref=item.ref,
            role=item.role,
            name=item.name,
            state=item.state,
            value=item.value,
            level=item.level,
            frame=" > ".join(item.frame) or None,
            box=item.box if item.interactive else None,
            interactive=item.interactive,
            options=item.options,
        )
        for number, item in enumerate(kept, start=1)
    )
    # Nested sections (a form inside an iframe, a dialog inside main) are indented; top-level
    # ones are not, which saves two characters on almost every line.
    lines = [
        "  " * max(0, len(item.landmarks) - 1) + element.render()
        for item, element in zip(kept, elements, strict=True)
    ]
    if omitted:
        lines.append(f"… {omitted} more elements not shown (max_elements={max_elements})")
    return Observation(
        url=redactor.text(taken.url),
        title=redactor.text(taken.title),
        elements=elements,
        text="\n".join(lines),
        omitted=omitted,
    )


# The serialiser ``take`` runs in the page's isolated world. It returns one JSON string:
# ``{url, title, passwords: [[ref, value], …], opaque_frames, steps, nodes}`` where a node is
# ``[role, name, attrs, text, props, children]`` (attrs as Playwright's snapshot writes them: ref,
# box, level, checked, cursor=pointer, …; props: url, placeholder, opaque) or a string of text,
# and a ref is a row of ``steps``, ``[row of the parent or -1, step]``, joined into a selector
# by ``_Selectors``.
# Elements without a role the observation keeps are flattened into their parent; a block boundary
# keeps the texts on either side apart.
_SERIALISE = (Path(__file__).parent / "observation.js").read_text()


# --- has the page changed? -----------------------------------------------------------------------

# Installed in an isolated world of the main frame: it shares the page's DOM, so the observer
# sees every mutation, but the page's own scripts cannot see or reset the counter.
_WATCH_INSTALL = """(() => {
  if (globalThis.__pandawebChanges !== undefined) return;
  globalThis.__pandawebChanges = 0;
  const bump = () => { globalThis.__pandawebChanges += 1; };
  new MutationObserver(bump).observe(document, {
    subtree: true, childList: true, attributes: true, characterData: true,
  });
  // What changes no DOM node: typed values, focus, scrolling of inner boxes, <details>.
  for (const type of ["input", "change", "focusin", "focusout", "scroll", "toggle"]) {
    document.addEventListener(type, bump, true);
  }
})()"""
_WATCH_READ = (
    "JSON.stringify([globalThis.__pandawebChanges, location.href, document.readyState,"
    " scrollX, scrollY, innerWidth, innerHeight, devicePixelRatio])"
)


class PageWatch:
    """Tells cheaply (one CDP round trip) whether a page may have changed since a mark.

    ``mark()`` returns a token; equal tokens from one ``PageWatch`` mean the same document with
    no DOM mutation, input, focus change or scroll in between, at the same URL, scroll position
    and viewport. ``None`` means "cannot tell" (a page with iframes, whose mutations the main
    frame's observer does not see; a CDP error): treat it as changed. Not seen: CSS animations,
    ``:hover`` and canvas drawing, which change pixels but no element a step acts on.
    """

    def __init__(self, page: Page, *, frames: FramePump | None = None) -> None:
        self.page = page
        self.frames = frames
        self._target: str | None = None
        self._session: Any = None
        self._context: int | None = None
        self._frame: str | None = None

    def mark(self) -> str | None:
        if len(self.page.frames) > 1:
            return None
        try:
            state = self.evaluate(_WATCH_READ)
        except PlaywrightError:
            return None
        return state if isinstance(state, str) else None

    def evaluate(self, expression: str, *, fresh: bool = False) -> Any:
        """The value of ``expression`` in this page's isolated world, made (with a fresh change
        counter) on the first call for each document, or when ``fresh``."""
        if self._session is None:
            self._session = self.page.context.new_cdp_session(self.page)
        if self._context is not None and not fresh:
            try:
                return self._evaluate(expression)
            except PlaywrightError:
                pass  # the document this world belonged to is gone
        # The main frame keeps its id across navigations, so it is asked for once.
        try:
            if self._frame is None:
                self._frame = self._session.send("Page.getFrameTree")["frameTree"]["frame"]["id"]
            world = self._session.send(
                "Page.createIsolatedWorld",
                {
                    "frameId": self._frame,
                    "worldName": "pandaweb-watch",
                    "grantUniveralAccess": False,
                },
            )
        except PlaywrightError:
            self._context = self._frame = None
            raise
        self._context = int(world["executionContextId"])
        return self._evaluate(_WATCH_INSTALL + ";" + expression)

    def screenshot(self, *, quality: int) -> bytes:
        """A JPEG of the viewport as it shows now, in one CDP round trip: the frame drawn for
        the page's state now where the browser draws on request (``frames``), else
        ``Page.captureScreenshot``.

        Playwright's ``page.screenshot`` spends three or four more (fonts, layout metrics, its
        own set-up) on every call: a fifth to a third of each step's picture. This one cannot
        mask: a picture with something to hide goes through Playwright's."""
        if self._session is None:
            self._session = self.page.context.new_cdp_session(self.page)
        if self.frames is not None and self.frames.drawing_on_request is not False:
            if self._target is None:
                self._target = self._session.send("Target.getTargetInfo")["targetInfo"]["targetId"]
            try:
                return self._frame_picture(self.frames.picture(self._target, quality=quality))
            except FramesError:
                if self.frames.drawing_on_request is not False:
                    raise
        answer = self._session.send(
            "Page.captureScreenshot", {"format": "jpeg", "quality": quality}
        )
        return base64.b64decode(answer["data"])

    def _frame_picture(self, picture: concurrent.futures.Future[bytes]) -> bytes:
        # Waited for in slices, letting Playwright serve its events in between: a dialog opened
        # while the frame was drawn holds the frame until someone answers it, and the runner's
        # answer comes through Playwright's event on this thread.
        while True:
            try:
                return picture.result(timeout=0.02)
            except concurrent.futures.TimeoutError:
                self.page.wait_for_timeout(1)

    def masked_screenshot(self, mask_paths: Sequence[str], *, quality: int) -> bytes | None:
        """A JPEG of the viewport with the fields at ``mask_paths`` (``Snapshot.mask_paths``)
        painted over, or None when their place cannot be known exactly: the page has frames
        (whose inputs another origin may hold), or a field is gone or moved while the picture
        was taken.

        The boxes are read in this watch's isolated world, where the page's scripts cannot
        change what ``getBoundingClientRect`` says, before and after one picture
        (``screenshot``). Playwright's masked ``page.screenshot`` draws overlays
        into the page and removes them again (a third of a second on a login page), and
        the overlays are changes the change counter sees."""
        if len(self.page.frames) > 1:
            return None
        read = f"({_BOXES})({json.dumps(list(mask_paths))})"
        before = self.evaluate(read)
        if before is None:
            return None
        jpeg = self.screenshot(quality=quality)
        if self.evaluate(read) != before:
            return None
        css_width, boxes = before
        return mask_frame(jpeg, boxes, {"deviceWidth": css_width}, quality=quality).jpeg

    def close(self) -> None:
        """Let go of the CDP session (the page and its world stay as they are)."""
        session, self._session, self._context = self._session, None, None
        if session is not None:
            with contextlib.suppress(PlaywrightError):
                session.detach()

    def _evaluate(self, expression: str) -> Any:
        answer = self._session.send(
            "Runtime.evaluate",
            {"expression": expression, "contextId": self._context, "returnByValue": True},
        )
        if "exceptionDetails" in answer:
            details = answer["exceptionDetails"]
            raise PlaywrightError(
                details.get("exception", {}).get("description") or details.get("text", "")
            )
        return answer.get("result", {}).get("value")


# The boxes of the elements at the serialiser's selectors (``html>body>div:nth-child(2)>…``, a
# step below a shadow host being one of its shadow root's children); null when one matches
# nothing. Every element a path may mean is boxed: masking too much is safe.
_BOXES = r"""paths => {
  const childrenOf = node => node === document ? [document.documentElement] :
    [...node.children, ...(node.shadowRoot ? node.shadowRoot.children : [])];
  const position = e => {
    let k = 1;
    for (let c = e.previousElementSibling; c; c = c.previousElementSibling) k += 1;
    return k;
  };
  const boxes = [];
  for (const path of paths) {
    let found = [document];
    for (const step of path.split(">")) {
      const [, name, nth] = /^([^:]+)(?::nth-child\((\d+)\))?$/.exec(step) || [];
      if (!name) return null;
      found = found.flatMap(childrenOf).filter(
        e => e.localName === name && (!nth || position(e) === Number(nth)));
    }
    if (!found.length) return null;
    for (const e of found) {
      const r = e.getBoundingClientRect();
      boxes.push([r.x, r.y, r.width, r.height]);
    }
  }
  return [innerWidth, boxes];
}"""
