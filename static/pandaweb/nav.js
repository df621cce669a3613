// The navigation's pending-approvals badge arrives over /ws/nav/ (htmx ws extension). When its
// number grows, a small toast says so; when it changes at all, "approvals:changed" is fired on
// <body> so a page can refresh itself (the approvals queue does).
(function () {
  "use strict";
  var toast = document.getElementById("approval-toast");
  var hideTimer = null;

  function count() {
    var badge = document.getElementById("approvals-badge");
    return badge ? parseInt(badge.textContent, 10) || 0 : null;
  }

  function show(added) {
    if (!toast) return;
    toast.querySelector("[data-toast-text]").textContent =
      added > 1 ? added + " new approvals waiting" : "New approval waiting";
    toast.hidden = false;
    clearTimeout(hideTimer);
    hideTimer = setTimeout(function () { toast.hidden = true; }, 8000);
  }

  var last = count();
  if (last === null) return;
  if (toast) {
    toast.querySelector("[data-toast-close]").addEventListener("click", function () {
      toast.hidden = true;
    });
  }
  document.body.addEventListener("htmx:wsAfterMessage", function () {
    var now = count();
    if (now === null || now === last) return;
    if (now > last) show(now - last);
    last = now;
    document.body.dispatchEvent(new CustomEvent("approvals:changed"));
  });
})();
