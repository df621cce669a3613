from __future__ import annotations

from typing import Any

from django import forms


class AwayForm(forms.Form):
    """A reviewer's out-of-office; both dates empty clears it."""

    away_from = forms.DateField(
        required=False, label="Away from", widget=forms.DateInput(attrs={"type": "date"})
    )
    away_until = forms.DateField(
        required=False,
        label="Back after",
        help_text="The last day away (included).",
        widget=forms.DateInput(attrs={"type": "date"}),
    )

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        start, end = data.get("away_from"), data.get("away_until")
        if (start is None) != (end is None) and not self.errors:
            raise forms.ValidationError("Give both dates, or neither to clear your absence.")
        if start and end and end < start:
            self.add_error("away_until", "The last day away comes before the first.")
        return data
