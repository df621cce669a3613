"""An external system driving pandaweb over HTTP, with nothing but the standard library.

Launches a run with an Idempotency-Key, follows it (printing one JSON line per status it sees)
until it ends, then fetches the run, downloads its evidence bundle and prints a summary line.
Reads PANDAWEB_URL, PANDAWEB_TOKEN, BUNDLE_PATH and the inputs as JSON in RUN_INPUTS.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.request
from typing import Any

BASE = os.environ["PANDAWEB_URL"].rstrip("/") + "/api/v1"
TOKEN = os.environ["PANDAWEB_TOKEN"]


def call(method: str, path: str, body: Any = None, headers: dict[str, str] | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(  # noqa: S310
        BASE + path if path.startswith("/") and not path.startswith("/api/") else path,
        data=data,
        method=method,
        headers={
            "Authorization": f"Bearer {TOKEN}",
            "Content-Type": "application/json",
            **(headers or {}),
        },
    )
    # Our own http:// base URL, never a user-supplied scheme.
    with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310
        return response.status, response.read()


def main() -> int:
    body = {"workflow": "acme-pay-invoice", "inputs": json.loads(os.environ["RUN_INPUTS"])}
    key = {"Idempotency-Key": "erp-payment-4711"}
    status, raw = call("POST", "/runs/", body, key)
    run = json.loads(raw)
    print(json.dumps({"launched": run["id"], "http": status}), flush=True)
    # A retry of the same request (a timeout on our side, say) gets the same run.
    again_status, again = call("POST", "/runs/", body, key)
    print(json.dumps({"retried": json.loads(again)["id"], "http": again_status}), flush=True)
    seen = ""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        _, raw = call("GET", f"/runs/{run['id']}")
        run = json.loads(raw)
        if run["status"] != seen:
            seen = run["status"]
            print(json.dumps({"status": seen}), flush=True)
        if run["status"] in {"succeeded", "failed", "cancelled", "expired", "interrupted"}:
            break
        time.sleep(1)
    origin = BASE.rsplit("/api/v1", 1)[0]
    _, bundle = call("GET", origin + run["links"]["bundle"])
    with open(os.environ["BUNDLE_PATH"], "wb") as out:
        out.write(bundle)
    print(
        json.dumps(
            {"final": run["status"], "outputs": run["outputs"], "bundle_bytes": len(bundle),
             "artifacts": [a["filename"] for a in run["artifacts"]]}
        ),
        flush=True,
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except urllib.error.HTTPError as exc:
        print(json.dumps({"error": exc.code, "body": exc.read().decode()}), flush=True)
        sys.exit(1)
