"""Form fields that keep what a person (or a forged request) sends within what the database
takes."""

from __future__ import annotations

from typing import Any

from django import forms
from django.core.exceptions import ValidationError

# Primary keys are 64-bit: a larger number would overflow the query (a 500 on SQLite, an aborted
# transaction on PostgreSQL) instead of being an unknown choice.
_LARGEST_ID = 2**63 - 1


class ModelChoicesField(forms.ModelMultipleChoiceField):
    """A ModelMultipleChoiceField that refuses out-of-range ids as unknown choices."""

    def clean(self, value: Any) -> Any:
        items = value if isinstance(value, list | tuple) else [value] if value else []
        for item in items:
            text = str(item).strip()
            if text.lstrip("-").isdigit() and abs(int(text)) > _LARGEST_ID:
                raise ValidationError(
                    self.error_messages["invalid_choice"],
                    code="invalid_choice",
                    params={"value": text[:20] + "…"},
                )
        return super().clean(value)
