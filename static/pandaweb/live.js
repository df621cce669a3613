// Live view: the run's browser as masked JPEG frames over a websocket, the step it is at, and,
// for people with the right, control of it (clicks, scrolls and keys sent as they happen, the
// page's dialogs answered, the time left before the run's time limit ends the control).
// A frame is a binary message: a 4-byte header length, a JSON header, the JPEG bytes.
(function () {
  "use strict";
  var root = document.getElementById("live");
  if (root && window.WebSocket) live(root);
  var scrubber = document.getElementById("filmstrip-scrubber");
  if (scrubber) filmstrip(scrubber);

  function live(root) {
    var frame = document.getElementById("live-frame");
    var now = document.getElementById("live-now");
    var steps = Array.prototype.slice.call(document.querySelectorAll("#live-steps li"));
    var take = document.getElementById("live-take");
    var release = document.getElementById("live-release");
    var takeWhy = document.getElementById("live-take-why");
    var state = document.getElementById("live-state");
    var timeLeft = document.getElementById("live-time");
    var dialog = document.getElementById("live-dialog");
    var dialogKind = document.getElementById("live-dialog-kind");
    var dialogMessage = document.getElementById("live-dialog-message");
    var answer = document.getElementById("live-dialog-answer");
    var prompt = document.getElementById("live-dialog-prompt");
    var promptText = document.getElementById("live-dialog-text");
    var dismiss = document.getElementById("live-dialog-dismiss");
    var me = root.dataset.userId;
    var socket = null;
    var inControl = false;
    var delay = 500;
    var frameUrl = null;
    var limitAt = null;
    var openDialog = "";
    var KINDS = {
      alert: "The page shows a message",
      confirm: "The page asks you to confirm",
      prompt: "The page asks for text",
      beforeunload: "The page asks whether to leave it",
      unknown: "The page shows a dialog",
    };

    function send(message) {
      if (socket && socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify(message));
    }

    function showStep(index) {
      steps.forEach(function (li, i) {
        li.className = i < index ? "done" : i === index ? "current" : "upcoming";
      });
      if (steps[index]) {
        now.textContent = "Step " + (index + 1) + " of " + steps.length + " — now: " +
          steps[index].textContent;
      }
    }

    function showTimeLeft() {
      if (limitAt === null) {
        timeLeft.hidden = true;
        return;
      }
      var left = Math.max(0, Math.round((limitAt - Date.now()) / 1000));
      var minutes = Math.floor(left / 60);
      timeLeft.textContent = "The run's time limit ends the control in " +
        (minutes ? minutes + " min " : "") + (left % 60) + " s.";
      timeLeft.hidden = false;
    }
    setInterval(showTimeLeft, 1000);

    function showDialog(data) {
      openDialog = data.kind;
      dialog.hidden = !data.kind;
      if (!data.kind) return;
      dialogKind.textContent = (KINDS[data.kind] || "The page shows a dialog") + ":";
      dialogMessage.textContent = data.message;
      if (promptText) promptText.value = data.default_prompt || "";
      if (prompt) prompt.hidden = data.kind !== "prompt";
      if (answer) answer.hidden = !inControl;
    }

    function answerDialog(accept) {
      var input = {kind: "dialog", accept: accept};
      if (accept && openDialog === "prompt" && promptText) input.text = promptText.value;
      send({type: "input", input: input});
    }
    if (answer) {
      answer.addEventListener("submit", function (event) {
        event.preventDefault();
        answerDialog(true);
      });
      dismiss.addEventListener("click", function () { answerDialog(false); });
    }

    // The run's state, in words and a picture, comes with the run page's own updates (run.js
    // swaps #live-still): while the browser works the live frame replaces it; otherwise the
    // live frame goes, the words and last picture stay, and whatever cannot act says why.
    function still() {
      return document.getElementById("live-still");
    }

    function browserWorks() {
      return still().dataset.live === "1";
    }

    function showRunState() {
      if (!browserWorks()) {
        // When the browser works again, its words show until its first new frame.
        if (frameUrl) URL.revokeObjectURL(frameUrl);
        frameUrl = null;
        frame.removeAttribute("src");
        frame.hidden = true;
        still().hidden = false;
      } else if (frameUrl) {
        frame.hidden = false;
        still().hidden = true;
      }
      if (take) {
        var why = still().dataset.takeRefusal;
        take.disabled = !!why;
        takeWhy.textContent = why;
        takeWhy.hidden = !why;
      }
    }
    root.addEventListener("run:fragment", showRunState);

    function showFrame(buffer) {
      // A frame still on its way when the run stopped driving its browser.
      if (!browserWorks()) return;
      var length = new DataView(buffer).getUint32(0);
      var data = JSON.parse(new TextDecoder().decode(new Uint8Array(buffer, 4, length)));
      var previous = frameUrl;
      frameUrl = URL.createObjectURL(new Blob([new Uint8Array(buffer, 4 + length)], {type: "image/jpeg"}));
      frame.src = frameUrl;
      if (previous) URL.revokeObjectURL(previous);
      frame.width = data.width;
      frame.height = data.height;
      frame.dataset.capturedAt = String(data.captured_at);
      frame.dataset.receivedAt = String(Date.now() / 1000);
      frame.dataset.masks = String(data.masks);
      frame.hidden = false;
      still().hidden = true;
    }

    function showControl(data) {
      inControl = data.state === "active" && String(data.user_id) === me;
      limitAt = data.state === "active" && data.seconds_left !== null && data.seconds_left !== undefined
        ? Date.now() + 1000 * data.seconds_left : null;
      showTimeLeft();
      if (data.state !== "active") showDialog({kind: ""});
      if (answer) answer.hidden = !inControl;
      frame.classList.toggle("controlled", inControl);
      if (take) take.hidden = data.state !== "none";
      if (release) {
        release.hidden = !(data.state !== "none" && String(data.user_id) === me);
        release.textContent = data.state === "pending" ? "Withdraw request" : "Hand back";
      }
      if (data.state === "pending") {
        state.textContent = data.username + " asked for control: it starts when the current step ends.";
      } else if (data.state === "active") {
        state.textContent = inControl
          ? "You have control. Click, scroll and type on the picture; the run waits."
          : data.username + " has control; the run waits.";
        if (inControl) frame.focus();
      } else {
        state.textContent = data.note || "";
      }
    }

    function point(event) {
      var box = frame.getBoundingClientRect();
      return {
        x: Math.min(1, Math.max(0, (event.clientX - box.left) / box.width)),
        y: Math.min(1, Math.max(0, (event.clientY - box.top) / box.height)),
      };
    }

    frame.addEventListener("click", function (event) {
      if (!inControl) return;
      var at = point(event);
      send({type: "input", input: {kind: "click", x: at.x, y: at.y}});
    });
    frame.addEventListener("wheel", function (event) {
      if (!inControl) return;
      event.preventDefault();
      var at = point(event);
      send({type: "input", input: {kind: "wheel", x: at.x, y: at.y, dx: event.deltaX, dy: event.deltaY}});
    }, {passive: false});
    frame.addEventListener("keydown", function (event) {
      if (!inControl || event.ctrlKey || event.metaKey || event.altKey) return;
      event.preventDefault();
      send({type: "input", input: {kind: "key", key: event.key}});
    });
    if (take) take.addEventListener("click", function () { send({type: "control", action: "take"}); });
    if (release) release.addEventListener("click", function () { send({type: "control", action: "release"}); });

    function connect() {
      var scheme = location.protocol === "https:" ? "wss://" : "ws://";
      socket = new WebSocket(scheme + location.host + root.dataset.liveWs);
      socket.binaryType = "arraybuffer";
      socket.onmessage = function (message) {
        delay = 500;
        if (typeof message.data !== "string") {
          showFrame(message.data);
          return;
        }
        var data = JSON.parse(message.data);
        if (data.type === "dialog") {
          showDialog(data);
        } else if (data.type === "step") {
          showStep(data.index);
        } else if (data.type === "control") {
          showControl(data);
        } else if (data.type === "refused") {
          state.textContent = data.reason;
        }
      };
      socket.onclose = function () {
        // The run ended: its page says so through its own stream; nothing more to show here.
        if (document.querySelector("[data-run-ws]").dataset.final === "1") return;
        setTimeout(connect, delay);
        delay = Math.min(delay * 2, 10000);
      };
    }
    connect();
  }

  function filmstrip(scrubber) {
    var picture = document.getElementById("filmstrip-frame");
    var at = document.getElementById("filmstrip-at");
    var frames = document.querySelectorAll("#filmstrip-frames li");
    scrubber.addEventListener("input", function () {
      var chosen = frames[parseInt(scrubber.value, 10)];
      if (!chosen) return;
      picture.src = scrubber.dataset.base + chosen.dataset.file;
      picture.alt = "The run's browser at " + chosen.dataset.at;
      at.textContent = chosen.dataset.at;
    });
  }
})();
