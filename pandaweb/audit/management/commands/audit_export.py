from __future__ import annotations

import argparse
import os
from datetime import date
from pathlib import Path
from typing import Any

from django.contrib.auth.models import User
from django.core.exceptions import ImproperlyConfigured, PermissionDenied
from django.core.management.base import BaseCommand, CommandError, CommandParser

from pandaweb.audit.export import ExportError, fingerprint
from pandaweb.audit.exports import AuditExportError, AuditFilter, audit_export


class Command(BaseCommand):
    help = (
        "Export the audit events a filter selects as a signed zip (events.jsonl, events.csv, "
        "manifest.json, manifest.sig); check it with audit_verify --export."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--out", required=True, help="the zip to write (a new file)")
        parser.add_argument(
            "--as",
            dest="as_user",
            required=True,
            metavar="USERNAME",
            help="who exports (needs the export_audit capability; recorded in the trail)",
        )
        parser.add_argument("--from", dest="date_from", type=_day, help="first day, YYYY-MM-DD")
        parser.add_argument("--to", dest="date_to", type=_day, help="last day (included)")
        parser.add_argument("--action", default="", help="action prefix, e.g. 'run.'")
        parser.add_argument("--actor", default="", help="username (or 'runner', 'system')")
        parser.add_argument("--workflow", default="", help="workflow slug")
        parser.add_argument("--run", dest="run_id", type=int, help="run id")
        parser.add_argument(
            "--team",
            default="",
            metavar="SLUG",
            help="export this team's trail, verifiable on its own (someone with Compliance in "
            "some teams only exports one of theirs, by default their only one)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        out = Path(options["out"])  # call_command passes options as they are given
        if out.exists():
            raise CommandError(f"{out} exists: an export never overwrites a file")
        try:
            user = User.objects.get(username=options["as_user"])
        except User.DoesNotExist:
            raise CommandError(f"no user {options['as_user']!r}") from None
        first_day, last_day = options["date_from"], options["date_to"]
        if first_day and last_day and first_day > last_day:
            raise CommandError("--to is before --from")
        filters = AuditFilter(
            date_from=first_day,
            date_to=last_day,
            actor=options["actor"],
            action=options["action"],
            workflow=options["workflow"],
            run_id=options["run_id"],
            team=options["team"],
        )
        # Written beside the target and renamed once complete: a failed export leaves no zip
        # that looks like one.
        partial = out.with_name(f".{out.name}.{os.getpid()}.partial")
        try:
            with partial.open("xb") as handle:
                manifest = audit_export(user=user, filters=filters, out=handle)
            partial.replace(out)
        except (
            AuditExportError,
            ExportError,
            ImproperlyConfigured,
            PermissionDenied,
            OSError,
        ) as exc:
            raise CommandError(str(exc)) from None
        finally:
            partial.unlink(missing_ok=True)
        span = (
            f"sequences {manifest.first_sequence}..{manifest.last_sequence}"
            if manifest.count
            else "no events"
        )
        whose = f" of team {manifest.team['slug']}" if manifest.team else ""
        self.stdout.write(
            f"exported {manifest.count} events{whose} ({span}) to {out}; "
            f"manifest sha256 {manifest.sha256}, signed by key {fingerprint(manifest.public_key)}"
        )


def _day(text: str) -> date:
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a date (YYYY-MM-DD)") from None
