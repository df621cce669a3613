"""Log in with a credential typed by code, never shown."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from sessions.engine.steps.base import (
    Acting,
    Problem,
    StepBase,
    StepFailed,
    StepKind,
    StepRecord,
    StepScope,
)
from sessions.engine.steps.language import Target


class LoginStep(StepBase):
    type: Literal["login"]
    label: ClassVar[str] = "Log in"
    editor_fields: ClassVar[tuple[str, ...]] = (
        "credential",
        "username_target",
        "password_target",
        "submit_target",
    )
    credential: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")
    username: Target
    password: Target
    submit: Target

    def sentence(self) -> str:
        return f"Log in with credential '{self.credential}', then click {self.submit.describe()}"

    def credentials(self) -> set[str]:
        return {self.credential, *super().credentials()}

    def problems(self, here: tuple[str | int, ...], scope: StepScope) -> list[Problem]:
        problems = []
        if self.credential not in scope.scoped:
            problems.append(
                Problem(
                    path=(*here, "credential"),
                    message=f"credential '{self.credential}' is not among this workflow's "
                    "credentials (settings → credentials)",
                )
            )
        kind = (scope.credential_kinds or {}).get(self.credential)
        if kind is not None and kind != "username_password":
            problems.append(
                Problem(
                    path=(*here, "credential"),
                    message=f"credential '{self.credential}' is a {kind}, "
                    "login needs a username and password",
                )
            )
        return problems


def act(runner: Acting, step: LoginStep, record: StepRecord, timeout: float) -> None:
    page = runner.page
    fields = runner.plan.secrets.get(step.credential)
    if not fields or "username" not in fields or "password" not in fields:
        raise StepFailed(f"credential '{step.credential}' is not available to this run")
    runner.locate(page, step.username).fill(fields["username"], timeout=timeout)
    runner.locate(page, step.password).fill(fields["password"], timeout=timeout)
    runner.locate(page, step.submit).click(timeout=timeout)
    runner.settle(page)


KIND = StepKind(LoginStep, act)
