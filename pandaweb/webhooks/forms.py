from __future__ import annotations

from django import forms

from pandaweb.webhooks.models import Event
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
    workflow = forms.ModelChoiceField(
        queryset=Workflow.objects.filter(archived=False).order_by("name"),
        required=False,
        empty_label="All workflows",
    )
    events = forms.MultipleChoiceField(choices=Event.choices, widget=forms.CheckboxSelectMultiple)
