"""Writing an audit export of many events: the peak memory it takes, and how long.

Run from the project root: ``.venv/bin/python bench/audit_export.py [--events 200000]``.

The events are made on the fly (a hash chain like the trail's) and written by the export's own
``write_export`` to a zip in a temporary directory; the figure is the process's peak resident
size (Linux ``/proc``, C buffers such as zlib's included) above what it was after a warm-up
export of 100 events, measured in this process alone. ``--json`` prints the figures as one JSON
object (``tests/audit/test_export.py`` runs it so, smaller).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from pandaweb.audit.chain import GENESIS, event_hash
from pandaweb.audit.export import write_export

T0 = datetime(2025, 3, 1, tzinfo=UTC)
MiB = 1024 * 1024


def status_bytes(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise LookupError(field)


def events(count: int) -> Iterator[dict[str, Any]]:
    prev_hash = GENESIS
    for sequence in range(1, count + 1):
        event: dict[str, Any] = {
            "sequence": sequence, "occurred_at": T0 + timedelta(seconds=sequence),
            "actor_kind": "runner", "actor_id": None, "actor_label": "runner",
            "action": "run.step_succeeded", "object_type": "run", "object_id": str(sequence // 50),
            "before": {"status": "running"}, "after": {"status": "succeeded"},
            "request_id": "", "client_ip": None, "run_id": sequence // 50, "step_id": sequence,
            "approval_id": None, "extra": {}, "prev_hash": prev_hash,
        }  # fmt: skip
        event["hash"] = prev_hash = event_hash(event, prev_hash)
        yield event


def measure(count: int, tmp_dir: str) -> dict[str, Any]:
    key = Ed25519PrivateKey.generate()
    with tempfile.TemporaryDirectory(dir=tmp_dir) as tmp:
        warm = os.path.join(tmp, "warm.zip")
        with open(warm, "wb") as out:  # allocates the buffers once, before the baseline
            write_export(events(100), out=out, filter={}, private_key=key, tmp_dir=Path(tmp))
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")  # the peak resident size starts again from the current one
        baseline = status_bytes("VmRSS")
        started = time.monotonic()
        big = os.path.join(tmp, "big.zip")
        with open(big, "wb") as out:
            manifest = write_export(
                events(count), out=out, filter={}, private_key=key, tmp_dir=Path(tmp)
            )
        seconds = time.monotonic() - started
        return {
            "count": manifest.count,
            "growth": status_bytes("VmHWM") - baseline,
            "seconds": seconds,
            "zip_bytes": os.path.getsize(big),
            "event_bytes": sum(f["bytes"] for f in manifest.files.values()),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--tmp-dir", default=tempfile.gettempdir())
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    figures = measure(args.events, args.tmp_dir)
    if args.json:
        print(json.dumps(figures))
        return
    print(
        f"{figures['count']:,} events: {figures['event_bytes'] / 1e6:.0f} MB of JSONL and CSV, "
        f"{figures['zip_bytes'] / 1e6:.0f} MB zipped, in {figures['seconds']:.1f} s; "
        f"peak resident size +{figures['growth'] / MiB:.1f} MiB (load {os.getloadavg()[0]:.1f}, "
        f"{os.cpu_count()} CPUs)"
    )


if __name__ == "__main__":
    main()
