from __future__ import annotations

from typing import Any

from django import forms

from pandaweb.core.models import Team
from pandaweb.core.permissions import in_teams
from pandaweb.webhooks.models import Event
from pandaweb.webhooks.selectors import MANAGE
from workflows.models import Workflow


class SubscriptionForm(forms.Form):
    name = forms.CharField(max_length=200, help_text="Who receives it, e.g. “ERP invoices”.")
    url = forms.URLField(
        max_length=2000,
        label="Address",
        assume_scheme="https",
        help_text="pandaweb POSTs JSON here, signed (Standard Webhooks). "
        "Redirects are not followed.",
    )
    team = forms.ModelChoiceField(
        queryset=Team.objects.none(),
        required=False,
        empty_label="The workflow's (or your only team)",
        help_text="It hears only this team's runs and approvals.",
    )
    workflow = forms.ModelChoiceField(
        queryset=Workflow.objects.none(),
        required=False,
        empty_label="All workflows",
    )
    events = forms.MultipleChoiceField(choices=Event.choices, widget=forms.CheckboxSelectMultiple)

    def __init__(self, *args: Any, user: Any, fixed_team: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Only the person's teams and their workflows are offered (the service checks again).
        team, workflow = self.fields["team"], self.fields["workflow"]
        assert isinstance(team, forms.ModelChoiceField)
        assert isinstance(workflow, forms.ModelChoiceField)
        team.queryset = in_teams(Team.objects.all(), user, MANAGE, via="pk")
        workflow.queryset = in_teams(
            Workflow.objects.filter(archived=False), user, MANAGE
        ).order_by("name")
        if fixed_team:
            # A subscription stays with the team it was made for.
            del self.fields["team"]
