"""``pandaweb``: the API from a shell, against any server (``--url``/``PANDAWEB_URL``, and a token
in ``PANDAWEB_TOKEN``, never on the command line where other users' ``ps`` would show it)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

import httpx2

from pandaweb_client.client import ApiError, Client, Run

# Exit codes a script can branch on.
OK, REFUSED, USAGE, RUN_DID_NOT_SUCCEED = 0, 1, 2, 3


def _inputs(pairs: Sequence[str]) -> dict[str, str]:
    inputs = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise SystemExit(f"pandaweb: an input is name=value, not {pair!r}")
        inputs[name] = value
    return inputs


def _print(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=True, default=str))


def _run_line(run: Run) -> str:
    line = f"run #{run.id} {run.workflow}: {run.status}"
    if run.failure_reason:
        line += f" ({run.failure_reason})"
    for approval in run.pending_approvals:
        line += f"\n  waits for approval #{approval['id']}: {approval['action']}"
    return line


def _finished(run: Run, as_json: bool) -> int:
    _print(run.raw) if as_json else print(_run_line(run))
    if run.finished and run.status != "succeeded":
        return RUN_DID_NOT_SUCCEED
    return OK


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pandaweb", description=__doc__)
    parser.add_argument("--url", default=os.environ.get("PANDAWEB_URL", ""))
    parser.add_argument("--json", action="store_true", help="print the server's JSON")
    commands = parser.add_subparsers(dest="command", required=True)

    launch = commands.add_parser("launch", help="launch a run: pandaweb launch SLUG name=value…")
    launch.add_argument("workflow")
    launch.add_argument("inputs", nargs="*", metavar="name=value")
    launch.add_argument("--priority", choices=["low", "normal", "high"])
    launch.add_argument("--idempotency-key")
    launch.add_argument("--callback-url")
    launch.add_argument("--wait", action="store_true", help="until it ends or waits for a person")
    launch.add_argument("--timeout", type=float, default=900.0)

    show = commands.add_parser("run", help="a run's status")
    show.add_argument("run_id", type=int)
    wait = commands.add_parser("wait", help="until the run ends or waits for a person")
    wait.add_argument("run_id", type=int)
    wait.add_argument("--timeout", type=float, default=900.0)
    cancel = commands.add_parser("cancel", help="cancel a run")
    cancel.add_argument("run_id", type=int)

    commands.add_parser("approvals", help="pending approval requests")
    approval = commands.add_parser("approval", help="one request: its facts and evidence hash")
    approval.add_argument("approval_id", type=int)
    decide = commands.add_parser("decide", help="approve or reject, bound to the evidence hash")
    decide.add_argument("approval_id", type=int)
    verdict = decide.add_mutually_exclusive_group(required=True)
    verdict.add_argument("--approve", action="store_true")
    verdict.add_argument("--reject", action="store_true")
    decide.add_argument("--evidence", required=True, help="the evidence_sha256 you looked at")
    decide.add_argument("--reason", default="")

    events = commands.add_parser("events", help="follow events as they happen (one JSON a line)")
    events.add_argument("--run", type=int, action="append", default=[])
    events.add_argument("--workflow", action="append", default=[])
    events.add_argument("--last-event-id")

    bundle = commands.add_parser("bundle", help="download a run's signed evidence bundle")
    bundle.add_argument("run_id", type=int)
    bundle.add_argument("path")

    args = parser.parse_args(argv)
    token = os.environ.get("PANDAWEB_TOKEN", "")
    if not args.url or not token:
        parser.error("set --url (or PANDAWEB_URL) and PANDAWEB_TOKEN (a token from your profile)")
    try:
        with Client(args.url, token) as client:
            return _command(client, args)
    except ApiError as refused:
        print(f"pandaweb: {refused.status}: {refused}", file=sys.stderr)
        return REFUSED
    except (httpx2.TransportError, TimeoutError) as exc:
        print(f"pandaweb: {exc}", file=sys.stderr)
        return REFUSED
    except KeyboardInterrupt:
        return OK


def _command(client: Client, args: argparse.Namespace) -> int:
    if args.command == "launch":
        run = client.launch(
            args.workflow,
            _inputs(args.inputs),
            priority=args.priority,
            idempotency_key=args.idempotency_key,
            callback_url=args.callback_url,
        )
        if args.wait:
            run = client.wait(run.id, timeout=args.timeout)
        return _finished(run, args.json)
    if args.command == "run":
        return _finished(client.run(args.run_id), args.json)
    if args.command == "wait":
        return _finished(client.wait(args.run_id, timeout=args.timeout), args.json)
    if args.command == "cancel":
        return _finished(client.cancel(args.run_id), args.json)
    if args.command == "approvals":
        found = client.approvals()
        if args.json:
            _print([a.raw for a in found])
            return OK
        for item in found:
            print(f"#{item.id} {item.action} (evidence {item.evidence_sha256[:12]}…)")
        return OK
    if args.command == "approval":
        item = client.approval(args.approval_id)
        if args.json:
            _print(item.raw)
            return OK
        print(f"approval #{item.id} ({item.status}) of run #{item.run}: {item.action}")
        for fact in item.facts:
            warning = ""
            if fact.get("on_page") is False:
                warning = "  (the page does not show it)"
            if fact.get("read_earlier") is not None:
                warning = f"  (read earlier: {fact['read_earlier']})"
            value = f"{fact.get('value')} {fact.get('currency') or ''}".strip()
            print(f"  {fact.get('label')}: {value}{warning}")
        print(f"  evidence sha256: {item.evidence_sha256}")
        return OK
    if args.command == "decide":
        item = client.decide(
            args.approval_id,
            approve=args.approve,
            evidence_sha256=args.evidence,
            reason=args.reason,
        )
        _print(item.raw) if args.json else print(f"approval #{item.id}: {item.status}")
        return OK
    if args.command == "events":
        for event in client.events(
            runs=args.run, workflows=args.workflow, last_event_id=args.last_event_id
        ):
            print(json.dumps({"id": event.id, "type": event.type, "data": event.data}), flush=True)
        return OK
    if args.command == "bundle":
        print(client.download_bundle(args.run_id, args.path))
        return OK
    raise AssertionError(args.command)  # pragma: no cover


if __name__ == "__main__":
    sys.exit(main())
