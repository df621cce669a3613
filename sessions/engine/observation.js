// The page serialiser of sessions/engine/observation.py (``take``), evaluated as one expression in the
// page's isolated world; see the comment above ``_SERIALISE`` there.
(() => {
  const INTERACTIVE = new Set(["button", "checkbox", "combobox", "link", "listbox", "menuitem",
    "menuitemcheckbox", "menuitemradio", "option", "radio", "searchbox", "slider", "spinbutton",
    "switch", "tab", "textbox", "treeitem"]);
  // Roles the observation keeps a node for; every other element is flattened into its parent.
  const KEPT = new Set([...INTERACTIVE, "heading", "banner", "navigation", "main", "contentinfo",
    "complementary", "search", "dialog", "alertdialog", "region", "form", "alert", "status",
    "row", "listitem", "article", "iframe"]);
  const NAMED_BY_CONTENT = new Set(["button", "link", "heading", "option", "checkbox", "radio",
    "tab", "menuitem", "menuitemcheckbox", "menuitemradio", "switch", "treeitem"]);
  const VALUE_ROLES = new Set(["textbox", "searchbox", "combobox", "spinbutton", "slider"]);
  const SKIP = new Set(["SCRIPT", "STYLE", "TEMPLATE", "NOSCRIPT", "HEAD", "META", "LINK"]);
  const SECTIONING = "article,aside,main,nav,section";
  const words = t => (t || "").replace(/\s+/g, " ").trim();
  const INPUT_ROLES = {button: "button", submit: "button", reset: "button", image: "button",
    checkbox: "checkbox", radio: "radio", range: "slider", number: "spinbutton",
    search: "searchbox", hidden: null, file: "button", color: null};

  const implicitRole = e => {
    switch (e.localName) {
      case "a": case "area": return e.hasAttribute("href") ? "link" : null;
      case "button": return "button";
      case "input": {
        const type = (e.getAttribute("type") || "text").toLowerCase();
        if (type in INPUT_ROLES) return INPUT_ROLES[type];
        return e.hasAttribute("list") ? "combobox" : "textbox";
      }
      case "select": return e.multiple || e.size > 1 ? "listbox" : "combobox";
      case "textarea": return "textbox";
      case "option": return "option";
      case "h1": case "h2": case "h3": case "h4": case "h5": case "h6": return "heading";
      case "nav": return "navigation";
      case "main": return "main";
      case "aside": return "complementary";
      case "search": return "search";
      case "dialog": return "dialog";
      case "form": return "form";
      case "section": return "region";
      case "output": return "status";
      case "tr": return "row";
      case "li": return "listitem";
      case "article": return "article";
      case "iframe": case "frame": return "iframe";
      case "header": case "footer": {
        const up = e.parentElement && e.parentElement.closest(SECTIONING);
        return up ? null : e.localName === "header" ? "banner" : "contentinfo";
      }
    }
    if (e.isContentEditable && !(e.parentElement && e.parentElement.isContentEditable))
      return "textbox";
    return null;
  };
  const roleOf = e => {
    const explicit = (e.getAttribute("role") || "").trim().split(/\s+/)[0].toLowerCase();
    if (explicit && explicit !== "none" && explicit !== "presentation" && explicit !== "generic")
      return explicit;
    return explicit ? null : implicitRole(e);
  };
  const byIds = (e, ids) => {
    const root = e.getRootNode();
    return words(ids.split(/\s+/).map(id => {
      const n = root.getElementById ? root.getElementById(id) : null;
      return n ? n.textContent : "";
    }).join(" "));
  };
  // A control's <label>s, gathered once per document or shadow root: asking each control for
  // its ``labels`` makes the browser search the whole tree for every one of them.
  const labelTexts = new Map();
  const labelled = new Set();
  const labelsOf = e => {
    const root = e.getRootNode();
    if (!labelled.has(root)) {
      labelled.add(root);
      for (const label of root.querySelectorAll("label")) {
        const control = label.control;
        if (control) labelTexts.set(control, [...(labelTexts.get(control) || []), label]);
      }
    }
    const found = labelTexts.get(e);
    return found ? words(found.map(l => l.textContent).join(" ")) : "";
  };
  // The accessible name, except what comes from content (the walk adds that).
  const ownName = (e, role) => {
    const ids = e.getAttribute("aria-labelledby");
    if (ids) { const named = byIds(e, ids); if (named) return named; }
    const label = words(e.getAttribute("aria-label"));
    if (label) return label;
    if (e.localName === "input") {
      const type = (e.getAttribute("type") || "text").toLowerCase();
      if (type === "submit" || type === "reset" || type === "button")
        return words(e.value) || (type === "submit" ? "Submit" : type === "reset" ? "Reset" : "");
      if (type === "image") return words(e.getAttribute("alt")) || "Submit";
    }
    const labels = labelsOf(e);
    if (labels) return labels;
    if (e.localName === "fieldset" || e.localName === "figure") return "";
    const title = words(e.getAttribute("title"));
    if (title && !NAMED_BY_CONTENT.has(role)) return title;
    if (role === "textbox" || role === "searchbox" || role === "combobox")
      return words(e.getAttribute("placeholder"));
    return "";
  };

  let focused = document.activeElement;
  while (focused) {
    const inner = focused.shadowRoot ? focused.shadowRoot.activeElement
      : (focused.contentDocument ? focused.contentDocument.activeElement : null);
    if (!inner || inner === focused) break;
    focused = inner;
  }
  if (!document.hasFocus()) focused = null;

  // A Playwright selector for an element: nth-child steps from its document, crossing shadow
  // hosts with ">" (Playwright's CSS pierces open shadow roots) and iframes with enter-frame.
  const indexes = new Map();
  const nth = e => {
    let known = indexes.get(e);
    if (known === undefined) {
      const parent = e.parentNode;
      let k = 0;
      for (let c = parent.firstElementChild; c; c = c.nextElementSibling) indexes.set(c, ++k);
      known = indexes.get(e);
    }
    return known;
  };
  // Sent as a table, one row per element on the way ([row of the parent, step]), and the ref as
  // a row number: a thousand rows' controls share their ancestors' steps instead of repeating
  // them, which halves what crosses CDP.
  const steps = [];
  const rows = new Map();
  const frameOf = new Map();
  const pathOf = e => {
    let row = rows.get(e);
    if (row !== undefined) return row;
    const parent = e.parentNode;
    const only = e.localName === "html" || e.localName === "body";
    const step = only ? e.localName : `${e.localName}:nth-child(${nth(e)})`;
    if (parent instanceof ShadowRoot) row = [pathOf(parent.host), ">" + step];
    else if (parent && parent.nodeType === 1) row = [pathOf(parent), ">" + step];
    else {
      const frame = frameOf.get(e.ownerDocument);
      row = frame ? [pathOf(frame), " >> internal:control=enter-frame >> " + step] : [-1, step];
    }
    steps.push(row);
    rows.set(e, steps.length - 1);
    return steps.length - 1;
  };

  const passwords = [];
  let opaqueFrames = 0;
  const round = Math.round;
  // area: where the content of the frame being walked shows, in viewport coordinates.
  const boxOf = (e, area) => {
    const r = e.getBoundingClientRect();
    if (r.width <= 0 || r.height <= 0) return null;
    const x = area.x + r.x, y = area.y + r.y;
    const left = Math.max(x, area.x), top = Math.max(y, area.y);
    const right = Math.min(x + r.width, area.x + area.w);
    const bottom = Math.min(y + r.height, area.y + area.h);
    if (right <= left || bottom <= top) return "";
    return `${round(left)},${round(top)},${round(right - left)},${round(bottom - top)}`;
  };
  const pseudo = (e, which) => {
    const content = getComputedStyle(e, which).content;
    if (!content || content === "none" || content === "normal") return "";
    const match = content.match(/^"(.*)"$/);
    return match ? match[1] : "";
  };
  const textOf = items => {
    const parts = [];
    for (const item of items) {
      if (typeof item === "string") parts.push(item);
      else if (item) {
        if (item[1]) parts.push(item[1]);
        else if (item[3]) parts.push(item[3]);
        else parts.push(textOf(item[5]));
      }
    }
    return words(parts.join(" "));
  };
  // Adjacent inline texts join; a block boundary (0) keeps them apart.
  const settle = items => {
    const out = [];
    let run = null;
    for (const item of items) {
      if (typeof item === "string") { run = run === null ? item : run + item; continue; }
      if (run !== null) { const t = words(run); if (t) out.push(t); run = null; }
      if (item !== 0) out.push(item);
    }
    if (run !== null) { const t = words(run); if (t) out.push(t); }
    return out;
  };

  const visitChildren = (e, out, ctx) => {
    if (e.localName === "slot") {
      const assigned = e.assignedNodes();
      if (assigned.length) { for (const n of assigned) visit(n, out, ctx); return; }
    }
    for (let c = e.firstChild; c; c = c.nextSibling) if (!c.assignedSlot) visit(c, out, ctx);
    if (!e.shadowRoot) return;
    for (let c = e.shadowRoot.firstChild; c; c = c.nextSibling) visit(c, out, ctx);
  };

  const visit = (n, out, ctx) => {
    if (n.nodeType === 3) {
      if (ctx.shown) out.push(n.nodeValue);
      return;
    }
    if (n.nodeType !== 1 || SKIP.has(n.nodeName)) return;
    const e = n;
    if (e.getAttribute("aria-hidden") === "true" || e.inert) return;
    const style = getComputedStyle(e);
    if (style.display === "none") return;
    const shown = style.visibility === "visible";
    const block = !style.display.startsWith("inline");
    let role = roleOf(e);
    // A one-time code typed in an earlier sitting of the run is no longer among the runner's
    // secrets: the field's purpose says it is one.
    if (e.localName === "input" && (e.type === "password" || e.autocomplete === "one-time-code"))
      passwords.push([pathOf(e), e.value]);
    if (shown && (e.localName === "img" || role === "img")) {
      // A picture's words (its alt text) name the link or button it sits in.
      const ids = e.getAttribute("aria-labelledby");
      const said = (ids && byIds(e, ids)) || words(e.getAttribute("aria-label")) ||
        words(e.getAttribute("alt")) || words(e.getAttribute("title"));
      if (said) out.push(" " + said + " ");
      return;
    }
    if (role && !KEPT.has(role)) role = null;
    const pointer = style.cursor === "pointer";
    // What Playwright calls [cursor=pointer]: a clickable element with no role of its own.
    const clickable = shown && pointer && !ctx.pointer && !ctx.inControl && !role;
    const inner = {area: ctx.area, shown, pointer, inControl: ctx.inControl};
    if (!shown || !(role || clickable)) {
      if (block) out.push(0);
      visitChildren(e, out, inner);
      if (block) out.push(0);
      return;
    }
    const attrs = {};
    const props = {};
    let name = ownName(e, role || "generic");
    let text = null;
    let children = [];
    const interactive = clickable || INTERACTIVE.has(role);
    if (interactive || role === "iframe") {
      const box = boxOf(e, ctx.area);
      if (box !== null && style.pointerEvents !== "none") {
        attrs.ref = pathOf(e);
        if (box) attrs.box = box;
        if (pointer) attrs.cursor = "pointer";
      }
    }
    if (role === "iframe") {
      let doc = null;
      try { doc = e.contentDocument; } catch (error) { doc = null; }
      if (doc && doc.documentElement) {
        frameOf.set(doc, e);
        // Boxes inside are placed from the frame's content origin, and clipped to the part
        // of its content box that shows in the frame around it.
        const r = e.getBoundingClientRect();
        const pad = side => parseFloat(style["padding" + side] || "0");
        const x = ctx.area.x + r.x + e.clientLeft + pad("Left");
        const y = ctx.area.y + r.y + e.clientTop + pad("Top");
        const right = Math.min(x + e.clientWidth - pad("Left") - pad("Right"),
          ctx.area.x + ctx.area.w);
        const bottom = Math.min(y + e.clientHeight - pad("Top") - pad("Bottom"),
          ctx.area.y + ctx.area.h);
        const sub = [];
        visit(doc.documentElement, sub, {area: {x, y, w: right - x, h: bottom - y},
          shown: true, pointer: false, inControl: false});
        children = settle(sub);
      } else {
        props.opaque = "cross-origin";
        opaqueFrames += 1;
      }
      out.push(["iframe", name, attrs, null, props, children]);
      return;
    }
    if (e === focused) attrs.active = "";
    if (role === "heading") {
      const level = e.getAttribute("aria-level") ||
        (/^h[1-6]$/.test(e.localName) ? e.localName[1] : "");
      if (level) attrs.level = level;
    }
    if (interactive) {
      inner.inControl = true;
      const checkable = role === "checkbox" || role === "radio" || role === "switch" ||
        role === "menuitemcheckbox" || role === "menuitemradio";
      if (checkable) {
        if (e.localName === "input") {
          if (e.indeterminate) attrs.checked = "mixed"; else if (e.checked) attrs.checked = "";
        } else {
          const checked = e.getAttribute("aria-checked");
          if (checked === "true") attrs.checked = "";
          else if (checked === "mixed") attrs.checked = "mixed";
        }
      }
      const pressed = e.getAttribute("aria-pressed");
      if (pressed === "true") attrs.pressed = "";
      else if (pressed === "mixed") attrs.pressed = "mixed";
      if (e.getAttribute("aria-selected") === "true") attrs.selected = "";
      if (e.getAttribute("aria-expanded") === "true") attrs.expanded = "";
      if (e.disabled === true || e.getAttribute("aria-disabled") === "true") attrs.disabled = "";
      if (e.getAttribute("aria-invalid") === "true") attrs.invalid = "";
      if (role === "link" && e.hasAttribute("href")) props.url = e.getAttribute("href");
      if (e.localName === "input" || e.localName === "textarea") {
        if (VALUE_ROLES.has(role)) text = e.value;
        const placeholder = e.getAttribute("placeholder");
        if (placeholder && placeholder !== name) props.placeholder = placeholder;
        out.push([role, name, attrs, text, props, []]);
        return;
      }
      if (e.localName === "select") {
        for (const option of e.options) {
          const chosen = option.selected ? {selected: ""} : {};
          children.push(["option", words(option.label || option.textContent), chosen, null, {},
            []]);
        }
        out.push([role, name, attrs, null, props, children]);
        return;
      }
    }
    const sub = [];
    // Generated content (a "▾" after a custom dropdown's value) is what people see there too;
    // read for such values only, as it costs a style computation per element.
    const generated = VALUE_ROLES.has(role);
    if (generated) sub.push(pseudo(e, "::before"), " ");
    visitChildren(e, sub, inner);
    if (generated) sub.push(" ", pseudo(e, "::after"));
    children = settle(sub);
    if (!name && (NAMED_BY_CONTENT.has(role) || clickable)) {
      name = textOf(children);
      if (!name && role) name = words(e.getAttribute("title"));
    }
    if (name && (NAMED_BY_CONTENT.has(role) || clickable))
      children = children.filter(c => typeof c !== "string");
    if (VALUE_ROLES.has(role) && children.length && children.every(c => typeof c === "string")) {
      text = words(children.join(" "));
      children = [];
    }
    if (block) out.push(0);
    out.push([clickable ? "generic" : role, name, attrs, text, props, children]);
    if (block) out.push(0);
  };

  const root = [];
  // The top document's boxes are not clipped: a control below the fold is still somewhere.
  const top = {x: 0, y: 0, w: Infinity, h: Infinity};
  visit(document.documentElement, root, {area: top, shown: true, pointer: false,
    inControl: false});
  return JSON.stringify({url: location.href, title: document.title, passwords,
    opaque_frames: opaqueFrames, steps, nodes: settle(root)});
})()
