from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings

from pandaweb.schedules.models import Schedule
from sessions.forms import LaunchForm


class ScheduleForm(LaunchForm):
    """The launch form's parameter fields plus when and how to launch."""

    name = forms.CharField(max_length=200)
    cron = forms.CharField(
        max_length=120,
        label="Cron expression",
        help_text="Five fields: minute hour day-of-month month day-of-week. "
        "0 6 * * 1-5 is 06:00 on weekdays; */30 * * * * is every 30 minutes.",
        widget=forms.TextInput(attrs={"spellcheck": "false", "autocapitalize": "off"}),
    )
    timezone = forms.CharField(
        max_length=64,
        label="Time zone",
        initial=settings.TIME_ZONE,
        help_text="A name like Europe/Berlin, America/New_York or UTC.",
    )
    overlap = forms.ChoiceField(
        choices=Schedule.Overlap.choices,
        widget=forms.RadioSelect,
        initial=Schedule.Overlap.SKIP,
        label="While the previous run is still active",
    )
    missed = forms.ChoiceField(
        choices=Schedule.Missed.choices,
        widget=forms.RadioSelect,
        initial=Schedule.Missed.RUN_ONCE,
        label="Ticks missed while pandaweb was down",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        del self.fields["idempotency_key"]
        # When and how first, then the inputs.
        order = ["name", "cron", "timezone", "overlap", "missed"]
        self.order_fields(order + [n for n in self.fields if n not in order])

    def parameter_fields(self) -> list[forms.BoundField]:
        return [self[name] for name in self.fields if name.startswith("param_")]

    def schedule_fields(self) -> list[forms.BoundField]:
        return [self[name] for name in self.fields if not name.startswith("param_")]


class BatchUploadForm(forms.Form):
    file = forms.FileField(
        label="CSV file",
        help_text="One column per parameter (the header line names them), one run per row, UTF-8.",
        widget=forms.ClearableFileInput(attrs={"accept": ".csv,text/csv"}),
    )
