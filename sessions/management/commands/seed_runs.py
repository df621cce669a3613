"""Fill the database with finished runs for measuring the console: ``seed_runs --runs 10000
--steps 10`` writes 10,000 runs and 100,000 step results in bulk (no browser, no audit rows:
these runs never happened, so the audit trail must not say they did)."""

from __future__ import annotations

import random
from datetime import timedelta
from typing import Any

import yaml
from django.contrib.auth.models import Group, User
from django.core.management.base import BaseCommand, CommandParser
from django.db import transaction
from django.utils import timezone

from pandaweb.core.roles import Role
from pandaweb.core.services import roles_sync
from sessions.models import Run, StepResult, run_search_text
from workflows import services as workflow_services
from workflows.models import Workflow, WorkflowVersion

WORKFLOWS = ("Seed pay invoice", "Seed download statements", "Seed update supplier")
STEPS = ("open", "login", "search", "fill_amount", "review", "pay", "confirm", "extract")
REASONS = (
    "the button 'Pay' was not on the page",
    "the portal answered 503 Service Unavailable",
    "expected text 'Paid' did not appear within 10 s",
)


class Command(BaseCommand):
    help = "Seed finished runs and their steps (for benchmarks and screenshots)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--runs", type=int, default=10_000)
        parser.add_argument("--steps", type=int, default=10)
        parser.add_argument("--days", type=int, default=30, help="spread over this many days")
        parser.add_argument("--seed", type=int, default=20)

    def handle(self, *args: Any, **options: Any) -> None:
        roles_sync()  # a version names its reviewer group, which must exist
        # Repeatable fake data, not secrets.
        rng = random.Random(options["seed"])  # noqa: S311
        users = [self._user(name) for name in ("seed-ops", "seed-finance", "seed-night")]
        versions = [self._version(name, users[0]) for name in WORKFLOWS]
        now = timezone.now()
        total, steps_per_run, days = options["runs"], options["steps"], options["days"]
        batch = 1000
        made = 0
        while made < total:
            size = min(batch, total - made)
            runs = [self._run(rng, versions, users, now, days, made + i) for i in range(size)]
            launched = [run.created_at for run in runs]
            with transaction.atomic():
                created = Run.objects.bulk_create(runs)
                # created_at is auto_now_add, which bulk_create applies; spread it again.
                for run, at in zip(created, launched, strict=True):
                    run.created_at = at
                Run.objects.bulk_update(created, ["created_at"], batch_size=500)
                StepResult.objects.bulk_create(
                    step for run in created for step in self._steps(rng, run, steps_per_run)
                )
            made += size
            self.stdout.write(f"{made} runs")
        self.stdout.write(self.style.SUCCESS(f"Seeded {made} runs, {made * steps_per_run} steps."))

    def _user(self, name: str) -> User:
        user, _ = User.objects.get_or_create(username=name)
        # Operators in every team: the seed's workflows are written and launched as them.
        user.groups.add(Group.objects.get(name=Role.OPERATORS.value))
        return user

    def _version(self, name: str, user: User) -> WorkflowVersion:
        slug = name.lower().replace(" ", "-")
        workflow = Workflow.objects.filter(slug=slug).first()
        if workflow is not None:
            version = workflow.versions.filter(status="published").order_by("-number").first()
            if version is not None:
                return version
        document = {
            "pandaweb": 1, "name": name, "slug": slug,
            "settings": {"allowed_hosts": ["127.0.0.1:8001"]},
            "parameters": [{"name": "invoice", "type": "string"}],
            "steps": [{"id": "open", "type": "goto", "url": "http://127.0.0.1:8001/"}],
        }  # fmt: skip
        workflow = workflow_services.workflow_import(user=user, text=yaml.safe_dump(document))
        return workflow_services.workflow_publish(
            workflow_id=workflow.pk, user=user, message="seed", accept_warnings=True
        )

    def _run(
        self,
        rng: random.Random,
        versions: list[Any],
        users: list[User],
        now: Any,
        days: int,
        n: int,
    ) -> Run:
        version = rng.choice(versions)
        created = now - timedelta(seconds=rng.uniform(0, days * 86400))
        failed = rng.random() < 0.15
        inputs = {"invoice": f"INV-{2026000 + n}"}
        outputs = {} if failed else {"confirmation": f"PAY-{rng.randrange(10**8):08d}"}
        return Run(
            workflow_id=version.workflow_id,
            version=version,
            status=Run.Status.FAILED if failed else Run.Status.SUCCEEDED,
            inputs=inputs,
            outputs=outputs,
            search_text=run_search_text(inputs, outputs),
            launched_by=rng.choice(users),
            created_at=created,
            started_at=created + timedelta(seconds=1),
            finished_at=created + timedelta(seconds=rng.uniform(5, 90)),
            steps_executed=rng.randrange(1, len(STEPS) + 1),
            failure_step=rng.choice(STEPS) if failed else "",
            failure_reason=rng.choice(REASONS) if failed else "",
        )

    def _steps(self, rng: random.Random, run: Run, count: int) -> list[StepResult]:
        assert run.started_at is not None
        return [
            StepResult(
                run=run,
                index=i,
                step_id=STEPS[i % len(STEPS)],
                step_type="click",
                sentence=f"Step {i + 1} of the seeded run",
                status=StepResult.Status.SUCCEEDED,
                started_at=run.started_at + timedelta(seconds=i),
                duration_ms=rng.randrange(50, 3000),
                url="http://127.0.0.1:8001/",
                title="Seed portal",
            )
            for i in range(count)
        ]
