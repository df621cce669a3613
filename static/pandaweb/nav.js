// The navigation's badge (what waits for you: pending approvals for those who see the queue,
// and the questions runs ask you) arrives over /ws/nav/ (htmx ws extension). When either number
// grows, a small toast says so and links to where it waits; when the badge changes at all,
// "approvals:changed" is fired on <body> so a page can refresh itself (the approvals queue does).
(function () {
  "use strict";
  var toast = document.getElementById("needs-toast");
  var hideTimer = null;

  function counts() {
    var badge = document.getElementById("needs-badge");
    if (!badge) return null;
    return {
      approvals: parseInt(badge.getAttribute("data-approvals"), 10) || 0,
      questions: parseInt(badge.getAttribute("data-questions"), 10) || 0,
    };
  }

  function show(text, url, label) {
    if (!toast) return;
    toast.querySelector("[data-toast-text]").textContent = text;
    var link = toast.querySelector("[data-toast-link]");
    link.setAttribute("href", url);
    link.textContent = label;
    toast.hidden = false;
    clearTimeout(hideTimer);
    hideTimer = setTimeout(function () { toast.hidden = true; }, 8000);
  }

  var last = counts();
  if (last === null) return;
  if (toast) {
    toast.querySelector("[data-toast-close]").addEventListener("click", function () {
      toast.hidden = true;
    });
  }
  document.body.addEventListener("htmx:wsAfterMessage", function () {
    var now = counts();
    if (now === null) return;
    if (now.approvals === last.approvals && now.questions === last.questions) return;
    var asked = now.questions - last.questions;
    var requested = now.approvals - last.approvals;
    if (asked > 0) {
      show(asked > 1 ? asked + " runs ask you a question" : "A run asks you a question",
           toast ? toast.getAttribute("data-questions-url") : "/", "See the questions");
    } else if (requested > 0) {
      show(requested > 1 ? requested + " new approvals waiting" : "New approval waiting",
           toast ? toast.getAttribute("data-approvals-url") : "/", "Open the queue");
    }
    last = now;
    document.body.dispatchEvent(new CustomEvent("approvals:changed"));
  });
})();
