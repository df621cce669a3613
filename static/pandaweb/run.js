// Live run page: applies server-rendered fragments by element id, so replays are harmless, and
// reconnects with the last sequence number it has, so nothing is missed.
(function () {
  "use strict";
  var root = document.querySelector("[data-run-ws]");
  if (!root || !window.WebSocket) return;
  var last = parseInt(root.dataset.lastSeq || "0", 10);
  var final = root.dataset.final === "1";
  var delay = 500;

  // Screen readers hear each new step once, in a short sentence, not the whole fragment.
  var announcer = document.getElementById("run-announcer");
  function announce(element) {
    if (!announcer || !element.classList.contains("timeline-step")) return;
    var sentence = element.querySelector(".sentence");
    var status = element.querySelector(".status");
    announcer.textContent = (sentence ? sentence.textContent.trim() : "New step") +
      (status ? ": " + status.textContent.trim() : "");
  }

  function apply(fragment) {
    var template = document.createElement("template");
    template.innerHTML = fragment.html.trim();
    var element = template.content.firstElementChild;
    if (!element) return;
    var existing = element.id ? document.getElementById(element.id) : null;
    if (existing) existing.replaceWith(element);
    else {
      var target = document.querySelector(fragment.target);
      if (target) target.append(element);
      announce(element);
    }
    // Fragments rendered outside a request carry no CSRF token: htmx adds it from <body>.
    if (window.htmx) window.htmx.process(element);
    // For the scripts of what it replaced (the live view reads the run's state from its own).
    element.dispatchEvent(new CustomEvent("run:fragment", {bubbles: true}));
  }

  function connect() {
    var scheme = location.protocol === "https:" ? "wss://" : "ws://";
    var socket = new WebSocket(scheme + location.host + root.dataset.runWs + "?after=" + last);
    socket.onmessage = function (message) {
      var data = JSON.parse(message.data);
      if (data.seq <= last) return;
      data.fragments.forEach(apply);
      last = data.seq;
      root.dataset.lastSeq = String(last);
      final = data.final;
      root.dataset.final = final ? "1" : "";
      delay = 500;
    };
    socket.onclose = function () {
      if (final) return;
      setTimeout(connect, delay);
      delay = Math.min(delay * 2, 10000);
    };
  }
  if (!final) connect();
})();
