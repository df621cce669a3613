// Passkeys: registration on the profile page, and the step-up on the decision page, where every
// verdict form posts with a fresh assertion whose challenge the server bound to the evidence.
(function () {
  "use strict";

  function csrf() {
    const match = document.cookie.match(/(?:^|;\s*)csrftoken=([^;]+)/);
    if (match) return decodeURIComponent(match[1]);
    const field = document.querySelector("input[name=csrfmiddlewaretoken]");
    return field ? field.value : "";
  }

  async function postJSON(url, body) {
    const response = await fetch(url, {
      method: "POST",
      credentials: "same-origin",
      headers: { "X-CSRFToken": csrf(), "Content-Type": "application/json" },
      body: body === undefined ? "{}" : JSON.stringify(body),
    });
    const data = await response.json();
    if (!response.ok) throw new Error(data.error || "the server refused");
    return data;
  }

  function say(element, text) {
    if (element) element.textContent = text;
  }

  // Decision page ------------------------------------------------------------------------------
  // The panel is swapped by htmx after every verdict: its elements are looked up when used.
  function stepUpPanel() {
    return document.getElementById("passkey-step-up");
  }

  function canUsePasskeys() {
    return (
      window.isSecureContext &&
      typeof window.PublicKeyCredential === "function" &&
      typeof PublicKeyCredential.parseRequestOptionsFromJSON === "function"
    );
  }

  // A failure is said beside the buttons and brought into view: a tap never ends in silence.
  function fail(text) {
    const error = document.getElementById("passkey-error");
    if (!error) return;
    error.textContent = text;
    error.hidden = false;
    error.scrollIntoView({ block: "center" });
  }

  function refuseWithoutPasskeys() {
    const panel = stepUpPanel();
    if (!panel || canUsePasskeys()) return;
    fail(
      "This browser cannot use passkeys, so it cannot decide this request. Open it on a device " +
        "whose browser supports passkeys (a current Chrome, Safari, Edge or Firefox)."
    );
    document.querySelectorAll("#decision-panel .decide-form button").forEach(function (button) {
      button.disabled = true;
    });
    document.querySelectorAll("#decision-panel .reject-open").forEach(function (link) {
      link.setAttribute("aria-disabled", "true");
      link.classList.add("disabled");
    });
  }

  if (stepUpPanel()) {
    refuseWithoutPasskeys();
    document.body.addEventListener("htmx:afterSwap", refuseWithoutPasskeys);
    // Capture phase: runs before htmx's own submit handler, which never sees the first submit.
    document.addEventListener(
      "submit",
      async function (event) {
        const panel = stepUpPanel();
        const form = event.target;
        if (!panel || !(form instanceof HTMLFormElement)) return;
        if (form.getAttribute("action") !== panel.dataset.decideUrl) return;
        let field = form.querySelector("input[name=passkey_assertion]");
        if (field && field.value) return; // the second submit, with the assertion: let it go
        event.preventDefault();
        event.stopImmediatePropagation();
        if (!form.reportValidity()) return;
        if (!canUsePasskeys()) {
          refuseWithoutPasskeys();
          return;
        }
        try {
          const options = await postJSON(panel.dataset.optionsUrl);
          const credential = await navigator.credentials.get({
            publicKey: PublicKeyCredential.parseRequestOptionsFromJSON(options),
          });
          if (!field) {
            field = document.createElement("input");
            field.type = "hidden";
            field.name = "passkey_assertion";
            form.appendChild(field);
          }
          field.value = JSON.stringify(credential.toJSON());
          form.requestSubmit();
        } catch (error) {
          const cancelled = error && error.name === "NotAllowedError";
          fail(
            cancelled
              ? "Nothing was recorded: the passkey check was cancelled or timed out. Tap again to retry."
              : "Nothing was recorded: the passkey check did not complete (" + error.message + ")."
          );
        }
      },
      true
    );
  }

  // Profile page ---------------------------------------------------------------------------------
  const register = document.getElementById("passkey-register");
  if (register) {
    register.addEventListener("submit", async function (event) {
      event.preventDefault();
      const status = document.getElementById("passkey-status");
      try {
        const options = await postJSON(register.dataset.optionsUrl);
        const credential = await navigator.credentials.create({
          publicKey: PublicKeyCredential.parseCreationOptionsFromJSON(options),
        });
        const name = register.querySelector("input[name=name]").value;
        await postJSON(register.action, { name: name, credential: credential.toJSON() });
        window.location.reload();
      } catch (error) {
        say(status, "Not registered: " + error.message);
      }
    });
  }
})();
