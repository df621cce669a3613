// A plain form (no htmx) that asks before it posts: <form data-confirm="Make a new secret?">.
// The page's Content Security Policy allows no inline handler, so the question lives here.
(function () {
  "use strict";
  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (!(form instanceof HTMLFormElement) || !form.dataset.confirm) return;
    if (!window.confirm(form.dataset.confirm)) event.preventDefault();
  });
})();
