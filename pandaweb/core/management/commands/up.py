from __future__ import annotations

import json
import os
import socket
import sys
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from pandaweb import supervisor
from pandaweb.core.selectors import deployment_summary
from pandaweb.demo_portal.state import DEMO_PASSWORD, DEMO_USERNAME
from sessions.services import host_queue
from workflows.management.commands.demo_workflow import demo_workflows_aim


def served_environment(
    environ: Mapping[str, str], host: str, port: int, portal_port: int | None
) -> dict[str, str]:
    """The settings the started processes need to follow the ports actually served: the
    dashboard's origins (websockets), its address (links in notifications, the passkey origin)
    unless one is configured (a public address behind a proxy), and the demo portal's address."""
    # A wildcard bind is not an address a browser can open; the loopback one is.
    wildcards = {"0.0.0.0": "127.0.0.1", "::": "[::1]", "": "127.0.0.1"}  # noqa: S104 (not a bind)
    reachable = wildcards.get(host, host)
    if ":" in reachable and not reachable.startswith("["):
        reachable = f"[{reachable}]"
    served = {"PANDAWEB_PORT": str(port)}
    if not environ.get("PANDAWEB_BASE_URL"):
        served["PANDAWEB_BASE_URL"] = f"http://{reachable}:{port}"
    if portal_port is not None:
        served["PANDAWEB_DEMO_PORTAL_URL"] = f"http://127.0.0.1:{portal_port}/"
    return served


class Command(BaseCommand):
    help = (
        "Start the dashboard (daphne), the bundled demo portal and, in scale-out mode, Celery "
        "workers; print the URL and demo logins once everything answers; stop all on Ctrl-C."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument(
            "--portal-port",
            type=int,
            default=urlsplit(settings.DEMO_PORTAL_URL).port or 8001,
            help="port of the demo portal (default: from PANDAWEB_DEMO_PORTAL_URL)",
        )
        parser.add_argument("--no-portal", action="store_true", help="do not start the demo portal")
        parser.add_argument(
            "--workers",
            type=int,
            default=None,
            help="Celery worker processes (scale-out only; default 1 there, 0 embedded)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        executor = MigrationExecutor(connection)
        pending = executor.migration_plan(executor.loader.graph.leaf_nodes())
        if pending:
            # Starting on an old schema would serve 500s; say what to do instead.
            raise CommandError(
                f"{len(pending)} database migration(s) not applied: "
                "run 'python manage.py migrate' first (scripts/quickstart does)"
            )
        host, port = options["host"], options["port"]
        portal_port = None if options["no_portal"] else options["portal_port"]
        os.environ.update(served_environment(os.environ, host, port, portal_port))
        if portal_port is not None:
            # On every start: a demo workflow aimed at another port would drive whatever portal
            # listens there (someone else's, on a shared machine).
            for line in demo_workflows_aim(portal=f"127.0.0.1:{portal_port}"):
                self.stdout.write(line)
        python = sys.executable
        children = [
            supervisor.Child(
                name="dashboard",
                argv=supervisor.dashboard_argv(python, host, port),
                ready_url=f"http://{host}:{port}/login/",
            )
        ]
        if portal_port is not None:
            children.append(
                supervisor.Child(
                    name="demo portal",
                    argv=[python, "manage.py", "demo_portal", "--port", str(portal_port)],
                    ready_url=f"http://127.0.0.1:{portal_port}/login",
                )
            )
        workers = options["workers"]
        if workers is None:
            workers = 1 if settings.RUN_EXECUTION == "celery" else 0
        if workers and settings.RUN_EXECUTION != "celery":
            raise CommandError("--workers needs scale-out mode: set REDIS_URL")
        for index in range(workers):
            children.append(
                supervisor.Child(
                    name=f"worker {index + 1}",
                    argv=[
                        python, "-m", "celery", "-A", "pandaweb", "worker",
                        # Threads: one process per worker keeps `up` light on a laptop; a
                        # run's browser and proxy outlive any worker either way.
                        "--loglevel", "INFO", "--pool", "threads", "--concurrency", "2",
                        "--hostname", f"worker{index + 1}@%h",
                        # The shared queue, and this machine's own: a sandbox lives on one host,
                        # so work on it (cancel, continue after approval) must reach that host.
                        "--queues",
                        f"{settings.CELERY_TASK_DEFAULT_QUEUE},{host_queue(socket.gethostname())}",
                    ],
                )
            )  # fmt: skip
        if workers:
            children.append(
                supervisor.Child(
                    name="scheduler",
                    argv=[python, "-m", "celery", "-A", "pandaweb", "beat", "--loglevel", "INFO",
                          "--schedule", str(settings.DATA_DIR / "celerybeat-schedule")],
                )
            )  # fmt: skip

        def banner() -> None:
            self.stdout.write(self._banner(host, port, options))
            self.stdout.flush()

        status = supervisor.run(children, on_ready=banner)
        if status:
            raise CommandError("pandaweb stopped because one of its processes failed")

    def _banner(self, host: str, port: int, options: dict[str, Any]) -> str:
        summary = deployment_summary()
        lines = [
            "",
            self.style.SUCCESS(f"pandaweb is running: http://{host}:{port}/"),
            f"  mode: {'embedded' if summary['embedded'] else 'scale-out'} · database "
            f"{summary['database']} · channel layer {summary['channel_layer']} · runs in "
            f"{summary['execution']}",
        ]
        if not options["no_portal"]:
            lines.append(
                f"  demo portal: http://127.0.0.1:{options['portal_port']}/ "
                f"(login {DEMO_USERNAME} / {DEMO_PASSWORD})"
            )
        logins_file = settings.DATA_DIR / "demo-logins.json"
        if logins_file.exists():
            lines.append("  demo logins (username · password):")
            for username, password in json.loads(logins_file.read_text()).items():
                lines.append(f"    {username:<18} {password}")
        lines.append("  stop with Ctrl-C")
        return "\n".join(lines) + "\n"
