"""``pandaweb``: the API from a shell, against any server (``--url``/``PANDAWEB_URL``, and a token
in ``PANDAWEB_TOKEN``, never on the command line where other users' ``ps`` would show it)."""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import httpx2

from pandaweb_client.client import ApiError, Client, Draft, Run, Schedule, SessionTemplate, Team

# Exit codes a script can branch on.
OK, REFUSED, USAGE, RUN_DID_NOT_SUCCEED = 0, 1, 2, 3
# The values each kind of credential takes, in the order they are asked for; the first of a
# username_password is not secret, so it is echoed as it is typed.
CREDENTIAL_FIELDS = {
    "username_password": ("username", "password"),
    "totp": ("seed",),
    "api_token": ("token",),
}


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


def _credential_values(kind: str) -> dict[str, str]:
    """The secret, never from the command line (``ps`` shows it to other users): typed at a
    prompt, or a JSON object on standard input (``< values.json``) when it is not a terminal."""
    if not sys.stdin.isatty():
        values = json.load(sys.stdin)
        if not isinstance(values, dict):
            raise SystemExit('pandaweb: standard input is a JSON object, {"password": "…"}')
        return {str(k): str(v) for k, v in values.items()}
    values = {}
    for name in CREDENTIAL_FIELDS[kind]:
        prompt = f"{name}: "
        values[name] = input(prompt) if name == "username" else getpass.getpass(prompt)
    return values


def _listed(args: argparse.Namespace, raw: list[dict[str, Any]], lines: list[str]) -> int:
    if args.json:
        _print(raw)
    else:
        for line in lines:
            print(line)
    return OK


def _template_line(template: SessionTemplate) -> str:
    line = f"session template of {template.workflow} v{template.version}: {template.status}"
    reason = template.failure_reason or template.stale_reason
    return f"{line} ({reason})" if reason else line


def _schedule_line(schedule: Schedule) -> str:
    line = f"schedule #{schedule.id} {schedule.workflow} '{schedule.name}': {schedule.in_words}"
    if schedule.paused:
        return f"{line}, paused"
    if schedule.next_times:
        line += f", next {schedule.next_times[0].isoformat()}"
    return line


def _draft_lines(draft: Draft) -> str:
    lines = [f"draft of {draft.workflow}: {len(draft.problems)} problems, "
             f"{len(draft.warnings)} warnings"]  # fmt: skip
    for kind, entries in (("problem", draft.problems), ("warning", draft.warnings)):
        lines += [
            f"  {kind}: {e.get('where') or e.get('field')}: {e.get('message')}" for e in entries
        ]
    return "\n".join(lines)


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
    again = commands.add_parser(
        "again", help="run again (name=value… to change inputs), or continue a failed run"
    )
    again.add_argument("run_id", type=int)
    again.add_argument("inputs", nargs="*", metavar="name=value")
    again.add_argument("--from", dest="start_step", default="", help="continue from this step id")
    again.add_argument("--latest", action="store_true", help="on the latest published version")
    again.add_argument("--priority", choices=["low", "normal", "high"])
    again.add_argument("--idempotency-key")
    answered = commands.add_parser("answer", help="answer the question a run waits at")
    answered.add_argument("run_id", type=int)
    answered.add_argument("answer")
    reconcile = commands.add_parser(
        "reconcile", help="say whether an approved action of the run happened on the portal"
    )
    reconcile.add_argument("run_id", type=int)
    happened = reconcile.add_mutually_exclusive_group(required=True)
    happened.add_argument("--happened", action="store_true")
    happened.add_argument("--did-not-happen", action="store_true")
    reconcile.add_argument("--note", required=True, help="what you checked on the portal")
    heal = commands.add_parser(
        "heal", help="a failed step's candidates; --pick N or --target T into the draft"
    )
    heal.add_argument("run_id", type=int)
    heal.add_argument("step_index", type=int)
    heal.add_argument("--field", default="", help="which target (a login step has three)")
    picked = heal.add_mutually_exclusive_group()
    picked.add_argument("--pick", type=int, metavar="N", help="element N of the step's page")
    picked.add_argument("--target", default="", help='a target: button "Pay now"')
    picked.add_argument(
        "--ask-model",
        metavar="WORDS",
        nargs="?",
        const="",
        help="have the model rank them, or choose the element WORDS describe",
    )
    heal.add_argument("--confirm", default="", help="the step's id, for an irreversible step")

    pending = commands.add_parser(
        "approvals", help="pending approval requests; comment on one, hand one over"
    )
    on_pending = pending.add_subparsers(dest="action")
    commented = on_pending.add_parser("comment", help="a remark for the request's reviewers")
    commented.add_argument("approval_id", type=int)
    commented.add_argument("text", nargs="+")
    handed = on_pending.add_parser("hand-over", help="hand a pending request to a person or group")
    handed.add_argument("approval_id", type=int)
    to = handed.add_mutually_exclusive_group(required=True)
    to.add_argument("--to", metavar="USER", help="a person of the run's team who may decide it")
    to.add_argument("--group", help="a group whose members decide approvals")
    handed.add_argument("--note", default="", help="why, for them and the audit trail")
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

    workflows = commands.add_parser("workflows", help="import, publish, bake workflows")
    on_workflow = workflows.add_subparsers(dest="action", required=True)
    on_workflow.add_parser("list", help="workflows with a published version")
    imported = on_workflow.add_parser("import", help="a workflow file becomes a draft")
    imported.add_argument("file", help="the workflow file (YAML, or JSON ending in .json)")
    draft = on_workflow.add_parser("draft", help="the draft's problems and warnings")
    draft.add_argument("workflow")
    publish = on_workflow.add_parser("publish", help="the draft becomes the next version")
    publish.add_argument("workflow")
    publish.add_argument("-m", "--message", required=True, help="what changed")
    publish.add_argument("--accept-warnings", action="store_true")
    publish.add_argument("--idempotency-key")
    for action, what in (("archive", "nothing launches it until restored"),
                         ("restore", "bring an archived workflow back")):  # fmt: skip
        on_workflow.add_parser(action, help=what).add_argument("workflow")
    versions = on_workflow.add_parser("versions", help="the published versions, newest first")
    versions.add_argument("workflow")
    template = on_workflow.add_parser("template", help="the session template's status")
    template.add_argument("workflow")
    bake = on_workflow.add_parser("bake", help="bake the session template again")
    bake.add_argument("workflow")
    bake.add_argument("--wait", action="store_true", help="until it is ready or failed")
    bake.add_argument("--timeout", type=float, default=300.0)

    credentials = commands.add_parser(
        "credentials", help="list, store, replace credentials (values typed at a prompt)"
    )
    on_credential = credentials.add_subparsers(dest="action", required=True)
    on_credential.add_parser("list", help="names, kinds, the workflows using them; no values")
    store = on_credential.add_parser(
        "add", help="store one; its values at a prompt, or as JSON on standard input"
    )
    store.add_argument("name")
    store.add_argument("--kind", choices=sorted(CREDENTIAL_FIELDS), default="username_password")
    store.add_argument("--description", default="")
    replace = on_credential.add_parser("replace", help="replace a credential's value")
    replace.add_argument("name")
    replace.add_argument("--kind", choices=sorted(CREDENTIAL_FIELDS), default="username_password")

    schedules = commands.add_parser("schedules", help="launch a workflow on a cron schedule")
    on_schedule = schedules.add_subparsers(dest="action", required=True)
    listed = on_schedule.add_parser("list", help="schedules with their next launch")
    listed.add_argument("--workflow")
    add = on_schedule.add_parser("add", help="pandaweb schedules add SLUG --name … --cron …")
    add.add_argument("workflow")
    add.add_argument("inputs", nargs="*", metavar="name=value")
    add.add_argument("--name", required=True)
    add.add_argument("--cron", required=True, help="five fields, e.g. '0 6 * * 1-5'")
    add.add_argument("--timezone", default="UTC")
    add.add_argument("--overlap", choices=["skip", "queue_one"])
    add.add_argument("--missed", choices=["run_once", "skip"])
    add.add_argument("--paused", action="store_true", help="launch nothing until resumed")
    for action, what in (("pause", "pause"), ("resume", "resume"), ("delete", "delete")):
        one = on_schedule.add_parser(action, help=f"{what} a schedule")
        one.add_argument("schedule_id", type=int)

    batch = commands.add_parser("batch", help="one run per row of a CSV file")
    batch.add_argument("workflow")
    batch.add_argument("file", help="a header line naming the parameters, one run per line")
    batch.add_argument("--launch-valid-rows", action="store_true",
                       help="launch the valid rows, keep the others back")  # fmt: skip
    batch.add_argument("--idempotency-key")

    teams = commands.add_parser("teams", help="teams and who holds which role (admins change it)")
    on_team = teams.add_subparsers(dest="action", required=True)
    on_team.add_parser("list", help="your teams and your roles there (admins: every team)")
    shown = on_team.add_parser("show", help="one team (admins: who holds which role there)")
    shown.add_argument("team", help="the team's short name")
    made = on_team.add_parser("create", help="make a team")
    made.add_argument("name")
    made.add_argument("--slug", default="", help="its short name (default: from the name)")
    for action, what in (("add", "give a person a role in a team"),
                         ("remove", "take a person's role in a team")):  # fmt: skip
        change = on_team.add_parser(action, help=what)
        change.add_argument("team", help="the team's short name")
        change.add_argument("username")
        change.add_argument("role", help="Operators, Reviewers or Compliance")

    args, extra = parser.parse_known_args(argv)
    # argparse takes the name=value inputs only before the first option; after it they are
    # left over, and still inputs.
    if extra and "inputs" in args and all("=" in e and not e.startswith("-") for e in extra):
        args.inputs += extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
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
    if args.command in MANAGING:
        return MANAGING[args.command](client, args)
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
        return _approvals(client, args)
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
        if item.assignee:
            print(f"  handed to {item.assignee}")
        for said in item.comments:
            print(f"  {said.author} commented: {said.body}")
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


def _again(client: Client, args: argparse.Namespace) -> int:
    run = client.again(
        args.run_id,
        _inputs(args.inputs) if args.inputs else None,
        start_step=args.start_step,
        latest_version=args.latest,
        priority=args.priority,
        idempotency_key=args.idempotency_key,
    )
    return _finished(run, args.json)


def _answer(client: Client, args: argparse.Namespace) -> int:
    answered = client.answer(args.run_id, args.answer)
    _print(answered) if args.json else print(f"run #{args.run_id}: {answered['run_status']}")
    return OK


def _reconcile(client: Client, args: argparse.Namespace) -> int:
    return _finished(
        client.reconcile(args.run_id, happened=args.happened, note=args.note), args.json
    )


def _heal(client: Client, args: argparse.Namespace) -> int:
    if args.pick is not None or args.target:
        draft = client.heal(
            args.run_id,
            args.step_index,
            number=args.pick,
            target=args.target,
            field=args.field,
            confirm=args.confirm,
        )
        _print(draft.raw) if args.json else print(_draft_lines(draft))
        return OK
    if args.ask_model is not None:
        found = client.ask_model(
            args.run_id, args.step_index, field=args.field, description=args.ask_model
        )
    else:
        found = client.healing(args.run_id, args.step_index, field=args.field)
    if args.json:
        _print(found.raw)
        return OK
    print(f"step {found.step_id} ({found.target_field}) looked for {found.looked_for}")
    for candidate in found.candidates:
        print(f"  [{candidate['number']}] {candidate['target']}: {'; '.join(candidate['reasons'])}")
    if found.model_call and found.model_call.get("error"):
        print(f"  the model proposed nothing: {found.model_call['error']}")
    if found.confirm:
        print(f"  irreversible: add --confirm {found.confirm} to change it")
    return OK


def _approvals(client: Client, args: argparse.Namespace) -> int:
    if args.action is None:
        found = client.approvals()
        return _listed(args, [a.raw for a in found],
                       [f"#{a.id} {a.action} (evidence {a.evidence_sha256[:12]}…)"
                        for a in found])  # fmt: skip
    if args.action == "comment":
        said = client.comment(args.approval_id, " ".join(args.text))
        _print(said.raw) if args.json else print(f"commented on approval #{args.approval_id}")
        return OK
    item = client.hand_over(args.approval_id, username=args.to, group=args.group, note=args.note)
    if args.json:
        _print(item.raw)
    else:
        print(f"approval #{item.id} handed to {item.assignee or item.reviewer_group}")
    return OK


def _workflows(client: Client, args: argparse.Namespace) -> int:
    if args.action == "list":
        workflows = client.workflows()
        return _listed(args, [w.raw for w in workflows],
                       [f"{w.slug} v{w.latest_version}: {w.name}" for w in workflows])  # fmt: skip
    if args.action == "import":
        workflow = client.import_workflow(args.file)
        _print(workflow.raw) if args.json else print(f"imported {workflow.slug} as a draft")
        return OK
    if args.action == "draft":
        draft = client.draft(args.workflow)
        _print(draft.raw) if args.json else print(_draft_lines(draft))
        return OK
    if args.action == "publish":
        version = client.publish(
            args.workflow,
            args.message,
            accept_warnings=args.accept_warnings,
            idempotency_key=args.idempotency_key,
        )
        _print(version.raw) if args.json else print(f"published {args.workflow} v{version.number}")
        return OK
    if args.action in {"archive", "restore"}:
        changed = (client.archive if args.action == "archive" else client.restore)(args.workflow)
        state = "archived" if changed.archived else "not archived"
        _print(changed.raw) if args.json else print(f"{changed.slug}: {state}")
        return OK
    if args.action == "versions":
        versions = client.versions(args.workflow)
        return _listed(args, [v.raw for v in versions],
                       [f"v{v.number} by {v.author}: {v.message}" for v in versions])  # fmt: skip
    template = (
        client.session_template(args.workflow)
        if args.action == "template"
        else client.bake_session_template(args.workflow)
    )
    if args.action == "bake" and args.wait:
        template = client.wait_session_template(args.workflow, timeout=args.timeout)
    _print(template.raw) if args.json else print(_template_line(template))
    return OK if template.status not in {"failed", "stale"} else RUN_DID_NOT_SUCCEED


def _credentials(client: Client, args: argparse.Namespace) -> int:
    if args.action == "list":
        credentials = client.credentials()
        return _listed(
            args,
            [c.raw for c in credentials],
            [f"{c.name} ({c.kind}), used by {', '.join(c.used_by) or 'no workflow'}"
             for c in credentials],
        )  # fmt: skip
    values = _credential_values(args.kind)
    if args.action == "add":
        stored = client.store_credential(args.name, args.kind, values, description=args.description)
        _print(stored.raw) if args.json else print(f"stored {stored.name}")
        return OK
    replaced = client.replace_credential_value(args.name, values)
    _print(replaced.raw) if args.json else print(f"replaced the value of {replaced.name}")
    return OK


def _schedules(client: Client, args: argparse.Namespace) -> int:
    if args.action == "list":
        schedules = client.schedules(workflow=args.workflow)
        return _listed(args, [s.raw for s in schedules], [_schedule_line(s) for s in schedules])
    if args.action == "delete":
        client.delete_schedule(args.schedule_id)
        print(f"deleted schedule #{args.schedule_id}")
        return OK
    if args.action == "add":
        schedule = client.create_schedule(
            args.workflow,
            args.name,
            args.cron,
            timezone=args.timezone,
            inputs=_inputs(args.inputs),
            overlap=args.overlap,
            missed=args.missed,
            paused=args.paused,
        )
    else:
        schedule = client.change_schedule(args.schedule_id, paused=args.action == "pause")
    _print(schedule.raw) if args.json else print(_schedule_line(schedule))
    return OK


def _batch(client: Client, args: argparse.Namespace) -> int:
    made = client.launch_batch_csv(
        args.workflow,
        args.file,
        launch_valid_rows=args.launch_valid_rows,
        idempotency_key=args.idempotency_key,
    )
    if args.json:
        _print(made.raw)
        return OK
    counts = ", ".join(f"{n} {label}" for label, n in sorted(made.counts.items()))
    print(f"batch #{made.id} of {made.workflow}: {made.total} rows ({counts})")
    for problem in made.invalid:
        print(f"  kept back: row {problem['row']} {problem['field']}: {problem['message']}")
    return OK


def _team_line(team: Team) -> str:
    line = f"{team.slug}: {team.name}"
    if team.my_roles:
        line += f", you: {', '.join(team.my_roles)}"
    if team.people is not None:
        line += f" (people: {team.people}, workflows: {team.workflows})"
    return line


def _teams(client: Client, args: argparse.Namespace) -> int:
    if args.action == "list":
        teams = client.teams()
        return _listed(args, [t.raw for t in teams], [_team_line(t) for t in teams])
    if args.action == "show":
        team = client.team(args.team)
        if args.json:
            _print(team.raw)
            return OK
        print(_team_line(team))
        for member in team.members or []:
            print(f"  {member['username']}: {', '.join(member['roles'])}")
        return OK
    if args.action == "create":
        team = client.team_create(args.name, slug=args.slug)
        said = f"made team {team.slug} ({team.name})"
    elif args.action == "add":
        team = client.team_member_add(args.team, args.username, args.role)
        said = f"{args.username} is {args.role} in {team.slug}"
    else:
        team = client.team_member_remove(args.team, args.username, args.role)
        said = f"{args.username} is not {args.role} in {team.slug}"
    _print(team.raw) if args.json else print(said)
    return OK


# The commands that manage what runs (each with its own actions), besides the runs' own.
MANAGING: dict[str, Callable[[Client, argparse.Namespace], int]] = {
    "again": _again,
    "answer": _answer,
    "reconcile": _reconcile,
    "heal": _heal,
    "workflows": _workflows,
    "credentials": _credentials,
    "schedules": _schedules,
    "batch": _batch,
    "teams": _teams,
}


if __name__ == "__main__":
    sys.exit(main())
