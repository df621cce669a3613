"""The refusal every workflow and credential service raises, with messages per form field."""

from __future__ import annotations


class WorkflowError(Exception):
    """A change that was refused; ``field_errors`` maps form fields to messages."""

    def __init__(self, message: str, field_errors: dict[str, list[str]] | None = None) -> None:
        super().__init__(message)
        self.field_errors = field_errors or {}


class NotYourTeam(WorkflowError):
    """A change of another team's workflow or credential, by someone who may see it (a reviewer
    there who authors elsewhere): the API answers 403, not 409."""
