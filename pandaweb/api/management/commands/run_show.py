from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.http import Http404

from pandaweb.api.documents import run_document


class Command(BaseCommand):
    help = "Show a run: status, steps, outputs, approvals and files (--json: as the API answers)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("run_id", type=int)
        parser.add_argument("--json", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            run = run_document(options["run_id"])
        except Http404:
            raise CommandError(f"no run {options['run_id']}") from None
        if options["json"]:
            self.stdout.write(json.dumps(run, indent=2))
            return
        write = self.stdout.write
        write(f"Run {run['id']} of {run['workflow']} v{run['version']}: {run['status']}")
        write(f"  launched by {run['launched_by']} at {run['created_at']}")
        if run["finished_at"]:
            write(f"  finished at {run['finished_at']}")
        if run["failure_reason"]:
            step = f" (step {run['failure_step']})" if run["failure_step"] else ""
            write(f"  failure{step}: {run['failure_reason']}")
        for title, values in (("Inputs", run["inputs"]), ("Outputs", run["outputs"])):
            if values:
                write(f"{title}:")
                for name, value in values.items():
                    write(f"  {name} = {value}")
        if run["steps"]:
            write("Steps:")
            for step in run["steps"]:
                error = f" — {step['error']}" if step["error"] else ""
                write(
                    f"  {step['index'] + 1:>3}. [{step['status']}] {step['sentence']} "
                    f"({step['duration_ms']} ms){error}"
                )
        for approval in run["approvals"]:
            write(
                f"Approval {approval['id']}: {approval['status']} "
                f"({approval['approvals']}/{approval['quorum']}), evidence "
                f"{approval['evidence_sha256'][:12]}…, expires {approval['expires_at']}"
            )
        for artifact in run["artifacts"]:
            size, digest = artifact["size"], artifact["sha256"]
            write(f"File: {artifact['filename']} ({size} bytes, sha256 {digest})")
