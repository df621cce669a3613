"""Ask a person and wait for the answer. Nothing happens on the page: the runner pauses the run
(holding no worker) and a continuation goes on with the answer."""

from __future__ import annotations

import re
from typing import Annotated, ClassVar, Literal

from pydantic import Field, model_validator

from sessions.engine.steps.base import Problem, StepBase, StepKind, StepScope
from sessions.engine.steps.language import IDENTIFIER

# Who may answer an ``ask`` step: the person who launched the run, or a group's members.
ASK_LAUNCHER = "launcher"
# What a one-time code may look like: SMS, e-mail and authenticator codes, with the dashes and
# spaces people copy along (they are removed before the code is typed).
ONE_TIME_CODE = re.compile(r"^[A-Za-z0-9]{3,12}$")


class AskStep(StepBase):
    """Ask a person and wait (holding no worker) for the answer, which later steps use as
    ``{{ outputs.<save_as> }}``. A one-time code is masked everywhere and never stored in clear."""

    type: Literal["ask"]
    label: ClassVar[str] = "Ask a person"
    in_session: ClassVar[bool] = False
    can_be_irreversible: ClassVar[bool] = False
    editor_fields: ClassVar[tuple[str, ...]] = (
        "question",
        "answer",
        "options_text",
        "save_as",
        "answered_by",
        "timeout_minutes",
    )
    question: str = Field(min_length=1, max_length=500)
    answer: Literal["text", "code", "choice"] = "text"
    options: list[Annotated[str, Field(min_length=1, max_length=200)]] = Field(
        default_factory=list, max_length=20
    )
    save_as: str = Field(pattern=IDENTIFIER)
    # "launcher" or the name of a group whose members may answer.
    answered_by: str = Field(default=ASK_LAUNCHER, min_length=1, max_length=150)
    timeout_minutes: int = Field(default=10, ge=1, le=24 * 60)

    @model_validator(mode="after")
    def _options_fit_answer(self) -> AskStep:
        if self.answer == "choice":
            if len(self.options) < 2:
                raise ValueError("a choice needs at least two options to choose from")
            if len({o.casefold() for o in self.options}) != len(self.options):
                raise ValueError("the options of a choice must differ from each other")
        elif self.options:
            raise ValueError(f"'options' belong to answer: choice, not answer: {self.answer}")
        if self.irreversible:
            raise ValueError(
                "asking a person changes nothing on the portal: an ask step is never irreversible"
            )
        return self

    def templates(self) -> list[tuple[str, str]]:
        return [("question", self.question)]

    def sentence(self) -> str:
        return f"Ask {ask_audience(self.answered_by)}: '{self.question}'"

    def problems(self, here: tuple[str | int, ...], scope: StepScope) -> list[Problem]:
        problems = scope.declare_output(self.save_as, (*here, "save_as"))
        if self.answer == "code":
            scope.codes.add(self.save_as)
        if self.answered_by != ASK_LAUNCHER and not re.fullmatch(r"[\w .@+-]+", self.answered_by):
            problems.append(
                Problem(
                    path=(*here, "answered_by"),
                    message="answered_by is 'launcher' or the name of a group",
                )
            )
        return problems


def ask_audience(answered_by: str) -> str:
    """Who an ask step waits for, in words."""
    return "the person who launched the run" if answered_by == ASK_LAUNCHER else answered_by


def one_time_code(text: str) -> str:
    """A one-time code as typed into the portal: spaces and dashes people copy along removed.
    Raises ValueError, in the answerer's words, for anything that is not a code."""
    code = re.sub(r"[\s-]", "", text)
    if not ONE_TIME_CODE.fullmatch(code):
        raise ValueError("a code is 3 to 12 letters or digits")
    return code


KIND = StepKind(AskStep, act=None)
