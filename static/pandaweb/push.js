// Browser notifications: register the service worker, subscribe with the server's VAPID key and
// hand the subscription to pandaweb.
(function () {
  "use strict";
  const button = document.getElementById("push-enable");
  if (!button) return;
  const status = document.getElementById("push-status");

  function keyBytes(base64url) {
    const padded = base64url.replace(/-/g, "+").replace(/_/g, "/") + "==".slice(0, (4 - (base64url.length % 4)) % 4);
    return Uint8Array.from(atob(padded), (c) => c.charCodeAt(0));
  }

  button.addEventListener("click", async function () {
    try {
      if (!("serviceWorker" in navigator) || !("PushManager" in window)) throw new Error("this browser has no Web Push");
      if ((await Notification.requestPermission()) !== "granted") throw new Error("notifications are not allowed");
      const registration = await navigator.serviceWorker.register(button.dataset.worker);
      const subscription = await registration.pushManager.subscribe({
        userVisibleOnly: true,
        applicationServerKey: keyBytes(button.dataset.key),
      });
      const token = document.querySelector("input[name=csrfmiddlewaretoken]").value;
      const response = await fetch(button.dataset.url, {
        method: "POST",
        credentials: "same-origin",
        headers: { "X-CSRFToken": token, "Content-Type": "application/json" },
        body: JSON.stringify(subscription.toJSON()),
      });
      if (!response.ok) throw new Error((await response.json()).error);
      status.textContent = "This device will be notified.";
    } catch (error) {
      status.textContent = "Not enabled: " + error.message;
    }
  });
})();
