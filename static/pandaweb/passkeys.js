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
  const stepUp = document.getElementById("passkey-step-up");
  if (stepUp) {
    const decideUrl = stepUp.dataset.decideUrl;
    // Capture phase: runs before htmx's own submit handler, which never sees the first submit.
    document.addEventListener(
      "submit",
      async function (event) {
        const form = event.target;
        if (!(form instanceof HTMLFormElement) || form.getAttribute("action") !== decideUrl) return;
        let field = form.querySelector("input[name=passkey_assertion]");
        if (field && field.value) return; // the second submit, with the assertion: let it go
        event.preventDefault();
        event.stopImmediatePropagation();
        if (!form.reportValidity()) return;
        try {
          const options = await postJSON(stepUp.dataset.optionsUrl);
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
          say(stepUp, "The passkey check did not complete: " + error.message);
          stepUp.setAttribute("role", "alert");
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
