from __future__ import annotations

from typing import Any

from django import forms

from sessions.models import Run
from workflows.schema import Parameter


class LaunchForm(forms.Form):
    """One field per launch parameter of the version, typed; the service validates again."""

    idempotency_key = forms.CharField(
        max_length=100,
        required=False,
        widget=forms.HiddenInput,
    )

    def __init__(self, *args: Any, parameters: list[Parameter], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parameters = parameters
        for parameter in parameters:
            self.fields[f"param_{parameter.name}"] = self._field(parameter)
        # After the parameters: what the run is about comes first, its place in line second.
        self.fields["priority"] = forms.ChoiceField(
            choices=Run.Priority.choices,
            required=False,
            initial=Run.Priority.NORMAL,
            help_text="When this workflow already runs as many runs as it may at once, higher "
            "priority runs start first, then the oldest.",
        )

    @staticmethod
    def _field(parameter: Parameter) -> forms.Field:
        common: dict[str, Any] = {
            "label": parameter.label or parameter.name,
            "help_text": parameter.help,
            "required": parameter.required and parameter.default is None,
            "initial": parameter.default,
        }
        if parameter.type == "boolean":
            return forms.BooleanField(**{**common, "required": False})
        if parameter.type == "enum":
            return forms.ChoiceField(choices=[(c, c) for c in parameter.choices or []], **common)
        # The same bound the service applies, so the form says it before anything else runs.
        common["max_length"] = parameter.longest
        if parameter.type == "date":
            return forms.CharField(widget=forms.DateInput(attrs={"type": "date"}), **common)
        if parameter.type in ("number", "money"):
            hint = f"in {parameter.currency}" if parameter.type == "money" else ""
            return forms.CharField(
                widget=forms.TextInput(attrs={"inputmode": "decimal", "placeholder": hint}),
                **common,
            )
        return forms.CharField(**common)

    def priority(self) -> int:
        """The chosen priority (normal when the field was left out)."""
        raw = str(self.cleaned_data.get("priority") or "")
        return int(raw) if raw else int(Run.Priority.NORMAL)

    def raw_inputs(self) -> dict[str, Any]:
        return {p.name: self.cleaned_data.get(f"param_{p.name}") for p in self.parameters}
