// Expiry countdowns: every [data-expires-in] counts down from the seconds the server computed
// when it rendered it (the browser's stopwatch, not its clock, which may be set wrong). Elements
// swapped in later by htmx start from their own value. The words mirror countdown_text() in
// approvals/templatetags/approval_expiry.py.
(function () {
  "use strict";
  var SOON = 300;
  var deadlines = new WeakMap();

  function text(left) {
    if (left <= 0) return "expired";
    if (left < 60) return "expires in " + left + " s";
    var minutes = Math.floor(left / 60);
    if (minutes < 60) return "expires in " + minutes + " min";
    var hours = Math.floor(minutes / 60);
    minutes = minutes % 60;
    if (hours < 24) return "expires in " + hours + " h " + (minutes < 10 ? "0" : "") + minutes + " min";
    return "expires in " + Math.floor(hours / 24) + " d " + (hours % 24) + " h";
  }

  function tick() {
    var now = Date.now();
    document.querySelectorAll("[data-expires-in]").forEach(function (element) {
      if (!deadlines.has(element)) {
        deadlines.set(element, now + 1000 * (parseInt(element.dataset.expiresIn, 10) || 0));
      }
      var left = Math.max(0, Math.floor((deadlines.get(element) - now) / 1000));
      var words = text(left);
      if (element.textContent !== words) element.textContent = words;
      element.classList.toggle("countdown-soon", left < SOON);
      element.classList.toggle("countdown-over", left === 0);
    });
  }

  tick();
  setInterval(tick, 1000);
})();
