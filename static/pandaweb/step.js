// The step page: ← and → (or k and j) open the previous and next step, z zooms the screenshot
// to its full size (scrollable) and back. Never while typing in a field.
(function () {
  "use strict";
  var nav = document.querySelector(".step-nav");
  var frame = document.querySelector("[data-zoom-frame]");
  var toggle = document.querySelector("[data-zoom-toggle]");

  function zoom() {
    if (!frame || !toggle) return;
    var on = frame.classList.toggle("zoomed");
    toggle.setAttribute("aria-pressed", on ? "true" : "false");
    toggle.textContent = on ? "Fit to the page" : "Zoom to full size";
  }

  if (toggle) toggle.addEventListener("click", zoom);
  var image = document.querySelector("[data-zoom]");
  if (image) image.addEventListener("click", zoom);

  document.addEventListener("keydown", function (event) {
    if (event.altKey || event.ctrlKey || event.metaKey || event.shiftKey) return;
    var target = event.target;
    if (target && (target.isContentEditable || /^(INPUT|TEXTAREA|SELECT)$/.test(target.tagName))) return;
    var go = null;
    if (event.key === "ArrowLeft" || event.key === "k") go = nav && nav.dataset.prev;
    if (event.key === "ArrowRight" || event.key === "j") go = nav && nav.dataset.next;
    if (go) {
      event.preventDefault();
      window.location.assign(go);
    } else if (event.key === "z") {
      zoom();
    }
  });
})();
