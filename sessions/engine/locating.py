"""Finding a step's target on the page, and saying in words why an action on it timed out
(nothing matched, several did, or something covers it)."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import Locator, Page
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from sessions.engine import wording
from sessions.engine.steps.base import StepBase, StepFailed
from sessions.engine.steps.language import Target

if TYPE_CHECKING:
    from sessions.engine.runner import Runner


# What covers the middle of an element: the nearest dialog (or named region) around what is
# there, a dialog inside it (a backdrop holding a modal), else the element itself. Described the
# way people see it: a role and a name, heading or label.
COVERED_BY = r"""(e, point) => {
  let x, y, root;
  if (point) { [x, y] = point; root = document; } else {
    const r = e.getBoundingClientRect();
    x = r.left + r.width / 2; y = r.top + r.height / 2;
    root = e.getRootNode && e.getRootNode().elementFromPoint ? e.getRootNode() : e.ownerDocument;
  }
  const hit = root.elementFromPoint(x, y);
  if (!hit) return null;
  if (point) { if (hit.tagName === 'IFRAME' || hit.tagName === 'FRAME') return null; }
  else if (hit === e || e.contains(hit) || hit.contains(e)) return null;
  const words = t => (t || '').replace(/\s+/g, ' ').trim();
  const firstLine = el => words((el.innerText || el.textContent || '').split('\n').find(
    l => l.trim()) || '');
  const nameOf = el => {
    const label = words(el.getAttribute('aria-label'));
    if (label) return label;
    const ids = words(el.getAttribute('aria-labelledby'));
    if (ids) {
      const doc = el.ownerDocument;
      const text = words(ids.split(' ').map(id => {
        const n = doc.getElementById(id); return n ? n.textContent : '';
      }).join(' '));
      if (text) return text;
    }
    const heading = el.querySelector('h1,h2,h3,h4,h5,h6,[role=heading],legend');
    if (heading && words(heading.textContent)) return words(heading.textContent);
    return firstLine(el);
  };
  const dialog = el => {
    const role = el.getAttribute('role');
    if (role === 'alertdialog') return 'alert dialog';
    if (role === 'dialog' || el.getAttribute('aria-modal') === 'true') return 'dialog';
    if (el.tagName === 'DIALOG') return 'dialog';
    return '';
  };
  const REGIONS = ['region', 'banner', 'complementary', 'contentinfo', 'navigation', 'alert',
    'status', 'form', 'menu', 'listbox', 'tooltip'];
  for (let el = hit; el; el = el.parentElement || (el.getRootNode().host || null)) {
    if (dialog(el)) return {kind: dialog(el), name: nameOf(el)};
    const role = el.getAttribute('role');
    if (REGIONS.includes(role) && (el.getAttribute('aria-label') ||
        el.getAttribute('aria-labelledby'))) return {kind: role, name: nameOf(el)};
  }
  const inner = hit.querySelector(
    '[role=dialog],[role=alertdialog],[aria-modal=true],dialog[open]');
  if (inner) return {kind: dialog(inner) || 'dialog', name: nameOf(inner)};
  const TAGS = {A: 'link', BUTTON: 'button', IMG: 'image', INPUT: 'field', SELECT: 'dropdown',
    TEXTAREA: 'field', HEADER: 'banner', FOOTER: 'footer', ASIDE: 'panel', NAV: 'navigation',
    IFRAME: 'frame'};
  const kind = hit.getAttribute('role') || TAGS[hit.tagName] || 'element';
  let name = nameOf(hit);
  if (!name && kind === 'element') {
    const cls = words(hit.getAttribute('class')).split(' ')[0];
    name = '<' + hit.tagName.toLowerCase() + (hit.id ? '#' + hit.id : cls ? '.' + cls : '') + '>';
  }
  return {kind, name};
}"""


def locate(
    runner: Runner, scope: Page | Locator, target: Target, *, strict: bool = True
) -> Locator:
    base: Any = scope
    for frame in target.frame:
        base = base.frame_locator(frame)
    if target.role:
        name = runner.text(target.name) if target.name else None
        locator = base.get_by_role(target.role, name=name, exact=target.exact)
    elif target.label:
        locator = base.get_by_label(runner.text(target.label), exact=target.exact)
    elif target.placeholder:
        locator = base.get_by_placeholder(runner.text(target.placeholder), exact=target.exact)
    elif target.text:
        locator = base.get_by_text(runner.text(target.text), exact=target.exact)
    elif target.test_id:
        locator = base.get_by_test_id(target.test_id)
    else:
        locator = base.locator(str(target.css))
    if target.nth is not None:
        return locator.nth(target.nth)
    if not strict:
        return locator
    count = locator.count()
    if count > 1:
        raise StepFailed(
            f"{count} elements match {target.describe()} on {runner.page.url}; "
            "make the target more exact or add nth"
        )
    return locator


def explain_timeout(runner: Runner, step: StepBase, exc: PlaywrightTimeout) -> str:
    """Why a step ran out of time, in the page's terms: a target that is not there, one that
    something else covers, one that is hidden or disabled. Playwright's own text last."""
    acts = step.touches_page
    for target in step.targets():
        try:
            locator = runner.locate(runner.page, target, strict=False)
            if locator.count() == 0:
                return f"no {noun(target)} on {runner.page.url}"
            if not acts:
                continue
            element = locator.first
            if not element.is_visible():
                return f"{target.describe()} is on {runner.page.url} but not visible"
            cover = covered_by(runner, element, target)
            if cover:
                return f"{cover} covers {target.describe()} on {runner.page.url}"
            if not element.is_enabled():
                return f"{target.describe()} is disabled on {runner.page.url}"
        except (PlaywrightError, StepFailed):
            continue
    return f"gave up after {step.timeout_ms} ms: {wording.first_line(str(exc))}"


def covered_by(runner: Runner, element: Locator, target: Target) -> str:
    """What lies over the middle of ``element`` ('' when nothing does), looked up in the
    element's own frame (or shadow root), then, for an element in an iframe, on the page."""
    wait = runner._scaled(2_000)
    with contextlib.suppress(PlaywrightError):  # where it is still says something
        element.scroll_into_view_if_needed(timeout=wait)
    found = element.evaluate(COVERED_BY, None, timeout=wait)
    if not found and target.frame:
        box = element.bounding_box(timeout=wait)
        if box is not None:
            middle = [box["x"] + box["width"] / 2, box["y"] + box["height"] / 2]
            found = runner.page.evaluate(f"point => ({COVERED_BY})(null, point)", middle)
    if not found:
        return ""
    kind, name = str(found.get("kind") or "element"), wording.clip(str(found.get("name") or ""))
    article = "an" if kind[:1] in "aeiou" else "a"
    return f"{article} {kind} '{name}'" if name else f"{article} {kind}"


def noun(target: Target) -> str:
    if target.role:
        return f"{target.role} named '{target.name}'" if target.name else target.role
    if target.label:
        return f"field labelled '{target.label}'"
    if target.placeholder:
        return f"field with placeholder '{target.placeholder}'"
    if target.text:
        return f"text '{target.text}'"
    if target.test_id:
        return f"element with test id '{target.test_id}'"
    return f"element matching {target.css}"
