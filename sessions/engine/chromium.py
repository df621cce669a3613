"""Locating and launching the system Chromium (no Django imports).

The product never downloads a browser: it uses the one the machine has, which the set-up script
installs from the distribution when it is missing.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from urllib.parse import urlsplit

# Chromium features that talk to Google on their own: autofill field predictions, optimization
# hints and on-device models, the network time service, translation, Cast discovery, the
# certificate transparency list, the password-leak check and variations. Chromium honours only
# the last --disable-features switch, so they all go into this one.
BACKGROUND_FEATURES: tuple[str, ...] = (
    "AutofillServerCommunication",
    "OptimizationHints",
    "OptimizationHintsFetching",
    "OptimizationGuideModelDownloading",
    "OptimizationTargetPrediction",
    "NetworkTimeServiceQuerying",
    "Translate",
    "MediaRouter",
    "DialMediaRouteProvider",
    "CertificateTransparencyComponentUpdater",
    "PasswordLeakDetection",
)

# Headless Chromium for runs: only the pages a workflow opens may cause traffic. Everything
# the browser would fetch for itself (updates, sign-in, safe browsing, metrics, field trials)
# would otherwise reach the run's proxy, be refused, and bury the page's real refusals in the
# audit trail. The managed policy (``MANAGED_POLICY``) switches off what no flag reaches.
HEADLESS_ARGS: tuple[str, ...] = (
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-component-extensions-with-background-pages",
    "--disable-default-apps",
    "--disable-sync",
    "--disable-quic",
    "--disable-dev-shm-usage",
    "--disable-breakpad",
    "--disable-client-side-phishing-detection",
    "--disable-domain-reliability",
    "--disable-field-trial-config",
    "--safebrowsing-disable-auto-update",
    "--metrics-recording-only",
    "--no-pings",
    "--no-service-autorun",
    "--password-store=basic",
    # Some components register themselves whatever --disable-component-update and the policy
    # say (Chromium 156: the optimization guide's on-device models manifest, which asked
    # update.googleapis.com at every start). Aimed at a file URL, their update check fails
    # inside the browser and never reaches the network.
    "--component-updater=url-source=file:///dev/null",
    f"--disable-features={','.join(BACKGROUND_FEATURES)}",
)

# The headless shell first: the same Chromium build without the desktop browser around it
# (122 MiB of processes on an empty page against 205 MiB for ``chromium --headless=new``), and
# the only one that draws a page's frames on request (``BEGIN_FRAME_ARGS``).
HEADLESS_SHELL = "chromium-headless-shell"
_CANDIDATES = (
    HEADLESS_SHELL,
    "chromium",
    "chromium-browser",
    "google-chrome",
    "google-chrome-stable",
)

# Debian's /usr/bin/chromium-headless-shell is a shell script that runs this as its child
# instead of replacing itself with it: a shell would stand between the sandbox and its browser
# (the namespace's init would not be the browser's parent, and a signal to the sandbox's process
# would reach the shell only).
_DEBIAN_HEADLESS_SHELL = "/usr/lib/chromium/chromium-headless-shell"

# A headless shell started with these draws a page only when a client sends
# ``HeadlessExperimental.beginFrame`` (every page: the first, new tabs and popups), and a frame
# asked for with a screenshot is the page's state at that moment. Without
# run-all-compositor-stages-before-draw every beginFrame is refused; deterministic mode adds it
# and keeps animations and scrolling on the page's main thread, where the frame is drawn.
BEGIN_FRAME_ARGS: tuple[str, ...] = (
    "--enable-begin-frame-control",
    "--deterministic-mode",
)


def is_headless_shell(executable: str) -> bool:
    """Whether ``executable`` is Chromium's headless shell (by its name, as Debian installs it
    and as Playwright's own build names it)."""
    return "headless-shell" in Path(executable).name or "headless_shell" in Path(executable).name


def launch_args(executable: str, *, begin_frame: bool) -> list[str]:
    """The switches that make ``executable`` headless, and draw on request where it can and
    ``begin_frame`` asks for it."""
    if not is_headless_shell(executable):
        return ["--headless=new"]
    return list(BEGIN_FRAME_ARGS) if begin_frame else []


def browser_label(version: str) -> str:
    """Which browser answered, in words, from its ``/json/version`` "Browser" field."""
    product, _, number = version.partition("/")
    if product == "HeadlessChrome":
        return f"Chromium headless shell {number}"
    if product == "Chrome":
        return f"Chromium {number} (headless mode of the desktop browser)"
    return version


def find_chromium(configured: str = "") -> str | None:
    """Return the path of the Chromium to drive, or None to let Playwright use its own build.

    ``configured`` (``EngineConfig.chromium``, from ``PANDAWEB_CHROMIUM``) wins when set; it must
    name an executable file. Otherwise the headless shell where it is installed, then the
    desktop Chromium.
    """
    if configured:
        if not (Path(configured).is_file() and os.access(configured, os.X_OK)):
            raise FileNotFoundError(f"PANDAWEB_CHROMIUM={configured!r} is not an executable file")
        return configured
    for name in _CANDIDATES:
        found = shutil.which(name)
        if found:
            if name == HEADLESS_SHELL and os.access(_DEBIAN_HEADLESS_SHELL, os.X_OK):
                return _DEBIAN_HEADLESS_SHELL
            return found
    return None


# The managed policy every sandbox's Chromium gets (Debian's Chromium reads
# /etc/chromium/policies/managed/*.json; no switch points it elsewhere, and the --policy switch
# is ignored by release builds). It switches off, beyond the flags above, what only a policy
# reaches: the password-leak check on every login form, component updates, sign-in, safe
# browsing lookups, variations and the rest of Chromium's own calls home.
MANAGED_POLICY_NAME = "pandaweb.json"
MANAGED_POLICY: dict[str, object] = {
    "PasswordLeakDetectionEnabled": False,
    "PasswordManagerEnabled": False,
    "AutofillAddressEnabled": False,
    "AutofillCreditCardEnabled": False,
    "ComponentUpdatesEnabled": False,
    "BrowserSignin": 0,
    "SyncDisabled": True,
    "SafeBrowsingProtectionLevel": 0,
    "SafeBrowsingExtendedReportingEnabled": False,
    "ChromeVariations": 2,
    "MetricsReportingEnabled": False,
    "UrlKeyedAnonymizedDataCollectionEnabled": False,
    "DomainReliabilityAllowed": False,
    "TranslateEnabled": False,
    "SpellcheckEnabled": False,
    "SearchSuggestEnabled": False,
    "AlternateErrorPagesEnabled": False,
    "NetworkPredictionOptions": 2,
    "DnsOverHttpsMode": "off",
    "EnableMediaRouter": False,
    "BackgroundModeEnabled": False,
    "DefaultBrowserSettingEnabled": False,
    "PromotionalTabsEnabled": False,
    "ShoppingListEnabled": False,
    "FeedbackSurveysEnabled": False,
    "PrivacySandboxPromptEnabled": False,
}


def managed_policy_json() -> bytes:
    """The managed policy file's content (stable bytes: the microVM image key hashes them)."""
    return (json.dumps(MANAGED_POLICY, indent=2, sort_keys=True) + "\n").encode()


# The same settings as profile preferences, for a browser that cannot be given the policy file
# (a local sandbox without namespaces: the policy directory is the whole machine's). A page
# cannot change them either, but they cover less than the policy, which wins where both exist.
PROFILE_PREFERENCES: dict[str, object] = {
    "credentials_enable_service": False,
    "profile": {"password_manager_enabled": False, "password_manager_leak_detection": False},
    "signin": {"allowed": False, "allowed_on_next_startup": False},
    "safebrowsing": {"enabled": False},
    "autofill": {"profile_enabled": False, "credit_card_enabled": False},
    "translate": {"enabled": False},
    "search": {"suggest_enabled": False},
    "alternate_error_pages": {"enabled": False},
    "net": {"network_prediction_options": 2},
}


def write_profile_preferences(user_data_dir: Path) -> None:
    """Seed a fresh user data directory's default profile with ``PROFILE_PREFERENCES``."""
    default = user_data_dir / "Default"
    default.mkdir(parents=True, exist_ok=True, mode=0o700)
    (default / "Preferences").write_text(json.dumps(PROFILE_PREFERENCES))


def browser_websocket_url(cdp_url: str, advertised: str) -> str:
    """The browser's websocket address as reachable from here: the browser names its own
    host and port, which a relay (namespaces, microVM) puts elsewhere."""
    reachable = urlsplit(cdp_url)
    named = urlsplit(advertised)
    scheme = "wss" if reachable.scheme == "https" else "ws"
    return f"{scheme}://{reachable.netloc}{named.path}"


def chromium_proxy_args(proxy_url: str) -> list[str]:
    """Chromium switches that send all of the browser's traffic through ``proxy_url``.

    Each switch was checked against Chromium 156 with a loopback portal, a loopback sink and a
    page that also loads an unlisted IP, an unlisted name and opens a WebRTC connection.
    """
    host = urlsplit(proxy_url).hostname or ""
    proxy_host = f"[{host}]" if ":" in host else host
    return [
        f"--proxy-server={proxy_url}",
        # Chromium never proxies localhost/127.0.0.0/8/[::1] unless told so; "<-loopback>" removes
        # that implicit bypass. Without it the loopback portal was fetched directly (the proxy
        # counted no request), so a page could reach the machine's own services unchecked.
        "--proxy-bypass-list=<-loopback>",
        # HTTP/3 runs over UDP, which an HTTP proxy does not carry.
        "--disable-quic",
        # Proxied names are handed to the proxy unresolved anyway; this is the second line: any
        # connection that would skip the proxy fails to resolve, IP literals included (with the
        # loopback bypass left on, the unlisted 127.0.0.9 still got nothing). The rule covers
        # IP literals, so the proxy's own address must be excluded or nothing loads.
        f"--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE {proxy_host}",
        # WebRTC sends STUN/TURN over UDP straight to the network: without this switch a page's
        # RTCPeerConnection sent UDP packets to an unlisted address around the proxy.
        "--webrtc-ip-handling-policy=disable_non_proxied_udp",
        # The headless shell reads only this one: with the switch above alone it sent STUN
        # packets to a page's server around the proxy (seen on 156).
        "--force-webrtc-ip-handling-policy=disable_non_proxied_udp",
    ]
