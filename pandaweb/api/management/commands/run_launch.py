from __future__ import annotations

import json
import os
import time
from typing import Any

from django.contrib.auth.models import User
from django.core.management.base import BaseCommand, CommandError, CommandParser

from pandaweb.api.documents import run_document
from pandaweb.core.permissions import user_can
from pandaweb.core.roles import Capability
from sessions.models import Run
from sessions.services import RunError, run_launch
from workflows.models import Workflow

# Exit codes a script can branch on.
EXIT_FAILED = 1  # the run ended other than succeeded
EXIT_INVALID = 2  # refused: unknown workflow or user, invalid inputs
EXIT_TIMEOUT = 3  # --wait gave up; the run goes on
EXIT_WAITING = 4  # --wait: the run waits for a person (an approval or an answer)

# Where --wait returns without the run having ended: a person has to act first.
WAITING_FOR_A_PERSON = frozenset({Run.Status.AWAITING_APPROVAL, Run.Status.AWAITING_ANSWER})


class Command(BaseCommand):
    help = (
        "Launch a run of a workflow's latest published version, as a user, through the same "
        "service as the launch form and the API. Prints the run id (or the run as JSON)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--workflow", required=True, help="the workflow's slug")
        parser.add_argument(
            "--input", action="append", default=[], metavar="NAME=VALUE", help="repeatable"
        )
        parser.add_argument(
            "--as",
            dest="username",
            default=os.environ.get("PANDAWEB_CLI_USER", ""),
            help="who launches (needs the launch capability); default $PANDAWEB_CLI_USER",
        )
        parser.add_argument(
            "--idempotency-key",
            default="",
            help="launching again with it and the same inputs returns the same run; with other "
            "inputs it is refused (exit 2)",
        )
        parser.add_argument(
            "--wait",
            action="store_true",
            help="wait until the run ends (exit 0 if it succeeded, 1 otherwise) or waits for a "
            "person's approval or answer (exit 4)",
        )
        parser.add_argument("--timeout", type=float, default=900.0, help="seconds, with --wait")
        parser.add_argument("--json", action="store_true", help="print the run as JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        user = _user(options["username"])
        workflow = Workflow.objects.filter(slug=options["workflow"]).first()
        if workflow is None:
            raise CommandError(f"no workflow has the slug {options['workflow']!r}", returncode=2)
        inputs: dict[str, str] = {}
        for item in options["input"]:
            name, sep, value = item.partition("=")
            if not sep or not name:
                raise CommandError(f"--input {item!r}: write NAME=VALUE", returncode=EXIT_INVALID)
            inputs[name.strip()] = value
        try:
            run = run_launch(
                workflow_id=workflow.pk,
                user=user,
                raw_inputs=inputs,
                idempotency_key=options["idempotency_key"],
            )
        except RunError as exc:
            lines = [str(exc)] + [
                f"  {name if name != '__all__' else 'inputs'}: {message}"
                for name, messages in exc.field_errors.items()
                for message in messages
            ]
            raise CommandError("\n".join(lines), returncode=EXIT_INVALID) from None
        if not options["json"]:
            self.stdout.write(f"run {run.pk} {run.status}")
        if options["wait"]:
            status = _wait(run.pk, options["timeout"], self.stderr.write)
        else:
            status = run.status
        if options["json"]:
            self.stdout.write(json.dumps(run_document(run.pk), indent=2))
        elif options["wait"]:
            self.stdout.write(f"run {run.pk} {status}")
        if options["wait"]:
            if status is None:
                raise CommandError(
                    f"run {run.pk} still going after the timeout", returncode=EXIT_TIMEOUT
                )
            if status in WAITING_FOR_A_PERSON:
                raise CommandError(
                    f"run {run.pk} is {status}: a person decides in the dashboard",
                    returncode=EXIT_WAITING,
                )
            if status != Run.Status.SUCCEEDED:
                raise CommandError(f"run {run.pk} ended {status}", returncode=EXIT_FAILED)


def _user(username: str) -> User:
    if not username:
        raise CommandError(
            "say who launches: --as USERNAME (or PANDAWEB_CLI_USER)", returncode=EXIT_INVALID
        )
    user = User.objects.filter(username=username, is_active=True).first()
    if user is None or not user_can(user, Capability.LAUNCH_RUNS):
        # One message for both: the command says nothing about which accounts exist.
        raise CommandError(f"{username!r} may not launch runs", returncode=EXIT_INVALID)
    return user


def _wait(run_id: int, timeout: float, say: Any) -> str | None:
    """Poll until the run is final, needs reconciliation or waits for a person; None at the
    timeout."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        status = Run.objects.values_list("status", flat=True).get(pk=run_id)
        if status != last:
            say(f"run {run_id}: {status}")
            last = status
        if (
            status in Run.FINAL
            or status in WAITING_FOR_A_PERSON
            or status == Run.Status.NEEDS_RECONCILIATION
        ):
            return status
        time.sleep(1.0)  # a person-scale wait; the database is the only channel here
    return None
