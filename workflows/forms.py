from __future__ import annotations

from typing import Any

from django import forms
from django.contrib.auth.models import Group
from django.utils.text import slugify
from pydantic import BaseModel

from pandaweb.core.fields import ModelChoicesField
from pandaweb.core.models import Team
from sessions.engine.steps.assertion import CHECK_ADAPTER
from sessions.engine.steps.extract import ExtractField
from sessions.engine.steps.language import Target
from workflows.editor_syntax import (
    format_check,
    format_extract_field,
    parse_check,
    parse_extract_field,
    parse_lines,
)
from workflows.models import Credential, Workflow
from workflows.schema import (
    DECISION_FACTS,
    RECORDING_OPTIONS,
    STEP_CLASSES,
    STEP_EDITOR_FIELDS,
    STEP_TYPES,
    ApprovalPolicy,
    DecisionFacts,
    WorkflowSettings,
)

# The decision facts' fields of the settings form, in its order: the facts and their currency.
FACT_FIELDS = (*DECISION_FACTS, "currency")

TARGET_HELP = (
    'How a person finds it on the page: button "Submit payment", link "Invoices", '
    'label Username, placeholder Search, text "Welcome", testid pay-btn, or css "#total" '
    "as a last resort. Options: exact, nth=N (0 = first), frame=SELECTOR."
)


def lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def offer_team_choice(
    form: forms.Form, teams: list[Team], *, required: bool = True, help_text: str = ""
) -> None:
    """A "team" field on a form that makes something, only for someone who may make it in more
    than one team: whoever has one team keeps the form they had (the service picks that team)."""
    if len(teams) < 2:
        return
    choices = [(team.slug, team.name) for team in teams]
    form.fields["team"] = forms.ChoiceField(
        choices=choices if required else [("", "—"), *choices],
        required=required,
        help_text=help_text,
    )


class WorkflowCreateForm(forms.Form):
    name = forms.CharField(max_length=200)
    slug = forms.SlugField(
        max_length=63,
        required=False,
        help_text="Used in addresses and files; from the name if empty.",
    )
    description = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), required=False)
    reviewer_group = forms.ModelChoiceField(
        queryset=Group.objects.order_by("name"), empty_label=None
    )
    allowed_hosts = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3}),
        required=False,
        help_text="One per line: portal.example.com, *.example.com, 127.0.0.1:8001. "
        "Everything else is blocked.",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        reviewers = Group.objects.filter(name="Reviewers").first()
        if reviewers is not None:
            self.fields["reviewer_group"].initial = reviewers.pk

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if not data.get("slug") and data.get("name"):
            data["slug"] = slugify(data["name"])[:63]
            if not data["slug"]:
                self.add_error("slug", "give a slug made of letters, digits and dashes")
        return data


def _setting(model: type[BaseModel], name: str, **kwargs: Any) -> forms.Field:
    """A form field for setting ``name`` of ``model``: its label, help and bounds are the
    schema's, so the form cannot drift from what a published version accepts."""
    info = model.model_fields[name]
    kwargs.setdefault("label", info.title)
    kwargs.setdefault("help_text", info.description or "")
    bounds = {
        key: getattr(rule, key)
        for rule in info.metadata
        for key in ("ge", "le")
        if getattr(rule, key, None) is not None
    }
    if info.annotation is bool:
        return forms.BooleanField(required=False, **kwargs)
    if info.annotation is int:
        return forms.IntegerField(min_value=bounds.get("ge"), max_value=bounds.get("le"), **kwargs)
    if info.annotation is float:
        return forms.FloatField(min_value=bounds.get("ge"), max_value=bounds.get("le"), **kwargs)
    return forms.CharField(**kwargs)


class WorkflowSettingsForm(forms.Form):
    """Every setting of a version (``WorkflowSettings``), its identity, and offering it to AI
    agents (which is no part of a version)."""

    name = forms.CharField(max_length=200)
    description = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), required=False)
    reviewer_group = forms.ModelChoiceField(
        queryset=Group.objects.order_by("name"), empty_label=None
    )
    allowed_hosts = _setting(
        WorkflowSettings, "allowed_hosts", widget=forms.Textarea(attrs={"rows": 3})
    )
    step_budget = _setting(WorkflowSettings, "step_budget")
    run_ttl_minutes = _setting(WorkflowSettings, "run_ttl_minutes")
    max_concurrent_runs = _setting(WorkflowSettings, "max_concurrent_runs")
    approval_quorum = _setting(ApprovalPolicy, "quorum")
    approval_expiry_minutes = _setting(ApprovalPolicy, "expiry_minutes")
    author_may_approve = _setting(ApprovalPolicy, "author_may_approve")
    approval_remind_before_minutes = _setting(ApprovalPolicy, "remind_before_minutes", initial=0)
    approval_escalate_after_minutes = _setting(ApprovalPolicy, "escalate_after_minutes", initial=0)
    approval_escalation_group = forms.ModelChoiceField(
        queryset=Group.objects.order_by("name"),
        required=False,
        to_field_name="name",
        label=ApprovalPolicy.model_fields["escalation_group"].title,
        empty_label="None",
    )
    approval_slack_channel = _setting(
        ApprovalPolicy, "slack_channel", required=False, max_length=80
    )
    approval_passkey = forms.ChoiceField(
        choices=[
            ("never", "never"),
            ("always", "always"),
            ("above", "above an amount"),
        ],
        label=ApprovalPolicy.model_fields["passkey"].title,
        help_text=ApprovalPolicy.model_fields["passkey"].description or "",
    )
    approval_passkey_above_amount = forms.DecimalField(
        required=False,
        min_value=0,
        decimal_places=2,
        label=ApprovalPolicy.model_fields["passkey_above_amount"].title,
        help_text=ApprovalPolicy.model_fields["passkey_above_amount"].description or "",
    )
    approval_fact_amount = _setting(DecisionFacts, "amount", required=False, max_length=63)
    approval_fact_currency = _setting(DecisionFacts, "currency", required=False, max_length=63)
    approval_fact_payee = _setting(DecisionFacts, "payee", required=False, max_length=63)
    approval_fact_reference = _setting(DecisionFacts, "reference", required=False, max_length=63)
    filmstrip = _setting(WorkflowSettings, "filmstrip")
    filmstrip_seconds_per_frame = _setting(WorkflowSettings, "filmstrip_seconds_per_frame")
    filmstrip_max_mb = _setting(WorkflowSettings, "filmstrip_max_mb")
    credentials = ModelChoicesField(
        queryset=Credential.objects.order_by("name"),
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text=WorkflowSettings.model_fields["credentials"].description,
    )
    offer_as_tool = forms.BooleanField(
        required=False,
        label="Offer as a tool to AI agents (MCP)",
        help_text="Not part of a version: applies at once, to the published version. "
        "Administrators only. Agents launch it with a token; irreversible steps still wait for "
        "a reviewer.",
    )

    @staticmethod
    def initial_from(workflow: Workflow) -> dict[str, Any]:
        """The form's values: the settings the next version carries, as the workflow holds
        them (the schema's defaults for the options it leaves out)."""
        reach = ApprovalPolicy.model_validate(workflow.approval_reach or {})
        recording = {
            option: (workflow.recording or {}).get(
                option, WorkflowSettings.model_fields[option].default
            )
            for option in RECORDING_OPTIONS
        }
        return {
            "name": workflow.name,
            "description": workflow.description,
            "reviewer_group": workflow.reviewer_group_id,
            "allowed_hosts": "\n".join(workflow.allowed_hosts),
            "step_budget": workflow.step_budget,
            "run_ttl_minutes": workflow.run_ttl_minutes,
            "max_concurrent_runs": workflow.max_concurrent_runs,
            "approval_quorum": workflow.approval_quorum,
            "approval_expiry_minutes": workflow.approval_expiry_minutes,
            "author_may_approve": workflow.author_may_approve,
            "approval_remind_before_minutes": workflow.approval_remind_before_minutes,
            "approval_escalate_after_minutes": workflow.approval_escalate_after_minutes,
            "approval_escalation_group": workflow.approval_escalation_group or None,
            "approval_slack_channel": reach.slack_channel or "",
            "approval_passkey": reach.passkey,
            "approval_passkey_above_amount": reach.passkey_above_amount,
            **{f"approval_fact_{fact}": getattr(reach.facts, fact) or "" for fact in FACT_FIELDS},
            **recording,
            "credentials": list(workflow.credentials.all()),
            "offer_as_tool": workflow.offer_as_tool,
        }

    def approval_reach(self) -> dict[str, Any]:
        """The Slack, passkey and decision facts options as the schema names them (validated by
        the service)."""
        data = self.cleaned_data
        amount = data.get("approval_passkey_above_amount")
        return {
            "slack_channel": data.get("approval_slack_channel", "").strip() or None,
            "passkey": data["approval_passkey"],
            "passkey_above_amount": None if amount is None else str(amount),
            "facts": {
                fact: value
                for fact in FACT_FIELDS
                if (value := data.get(f"approval_fact_{fact}", "").strip())
            },
        }

    def recording(self) -> dict[str, Any]:
        data = self.cleaned_data
        return {option: data[option] for option in RECORDING_OPTIONS}


# The editor's target fields and the step's key each fills.
_TARGET_KEYS = {
    "target": "target",
    "target_optional": "target",
    "username_target": "username",
    "password_target": "password",
    "submit_target": "submit",
}


class StepForm(forms.Form):
    """The fields of one step type; ``to_data`` gives the step as the file format has it."""

    # Which of the fields below each kind shows: the kind says (``editor_fields``).
    FIELDS = STEP_EDITOR_FIELDS
    # pydantic's field names → this form's
    SCHEMA_FIELDS = {
        "fields": "fields_text",
        "checks": "checks_text",
        "username": "username_target",
        "password": "password_target",
        "submit": "submit_target",
        "expect": "expect_value",
        "options": "options_text",
    }
    EXPECT_KINDS = ("text", "url", "target")

    id = forms.RegexField(
        regex=r"^[a-z0-9][a-z0-9-]{0,62}$",
        label="Step id",
        error_messages={"invalid": "lowercase letters, digits and dashes, e.g. submit-payment"},
    )
    description = forms.CharField(max_length=500, required=False)
    irreversible = forms.BooleanField(
        required=False,
        label="Irreversible: wait for a second person's approval before doing this",
    )
    expect_kind = forms.ChoiceField(
        required=False,
        choices=[
            ("", "—"),
            ("text", "the page shows a text"),
            ("url", "the address matches"),
            ("target", "an element appears"),
        ],
        label="Done when",
        help_text="Required for irreversible steps: how the portal shows that the action "
        "worked. Until the run sees it, the step is not done; an error the portal shows "
        "instead fails it.",
    )
    expect_value = forms.CharField(
        max_length=2000,
        required=False,
        label="Expected",
        help_text="A text (Payment submitted), an address (**/receipts/*) or a target "
        '(heading "Receipt").',
    )
    timeout_ms = forms.IntegerField(
        min_value=100, max_value=300_000, initial=10_000, label="Timeout (ms)"
    )
    dialog = forms.ChoiceField(
        required=False,
        choices=[
            ("", "none expected: a dialog fails the step"),
            ("accept", "accept it (OK)"),
            ("dismiss", "dismiss it (Cancel)"),
        ],
        label="A confirm/alert/prompt dialog the click opens",
    )
    prompt_text = forms.CharField(
        max_length=500,
        required=False,
        label="Text typed into a prompt dialog",
        help_text="Only with accept; may use {{ params.name }}.",
    )
    url = forms.CharField(
        max_length=2000,
        required=False,
        label="Address",
        help_text="May use {{ params.name }} in the path and query.",
    )
    target = forms.CharField(max_length=1000, required=False, help_text=TARGET_HELP)
    target_optional = forms.CharField(
        max_length=1000, required=False, label="Target", help_text=TARGET_HELP
    )
    value = forms.CharField(
        max_length=5000,
        required=False,
        help_text="Text to type; may use {{ params.x }}, {{ outputs.x }} or "
        "{{ secrets.credential.password }}.",
    )
    option = forms.CharField(max_length=300, required=False, help_text="The option's visible text.")
    key = forms.CharField(
        max_length=50, required=False, help_text="Enter, Tab, Escape, Control+A …"
    )
    condition = forms.ChoiceField(
        required=False,
        choices=[
            ("visible", "the target is visible"),
            ("hidden", "the target is hidden"),
            ("url", "the address matches"),
            ("text", "the page shows a text"),
            ("network_idle", "the network is idle"),
        ],
        label="Wait until",
    )
    text = forms.CharField(max_length=500, required=False)
    seconds = forms.FloatField(
        required=False,
        help_text="A fixed pause, at most 60 seconds. Prefer “Wait for” what the page shows.",
    )
    fields_text = forms.CharField(
        required=False,
        label="Fields",
        widget=forms.Textarea(attrs={"rows": 4, "class": "mono"}),
        help_text="One per line: total = money of testid amount-due · link = attribute href of "
        'link "Download" · rows = rows of css "tbody tr" with number: css td.number',
    )
    checks_text = forms.CharField(
        required=False,
        label="Checks",
        widget=forms.Textarea(attrs={"rows": 4, "class": "mono"}),
        help_text='One per line: page shows "Paid" · page does not show "Error" · address matches '
        '**/receipts/* · count of css "tbody tr" >= 1 · outputs.total == params.amount',
    )
    name = forms.CharField(max_length=63, required=False, help_text="e.g. invoice_pdf")
    full_page = forms.BooleanField(required=False, label="Whole page, not just the visible part")
    credential = forms.ModelChoiceField(
        queryset=Credential.objects.filter(kind=Credential.Kind.USERNAME_PASSWORD),
        to_field_name="name",
        required=False,
        help_text="Its username and password are typed by code and never shown.",
    )
    username_target = forms.CharField(
        max_length=1000, required=False, label="Username field", initial="label Username"
    )
    password_target = forms.CharField(
        max_length=1000, required=False, label="Password field", initial="label Password"
    )
    submit_target = forms.CharField(
        max_length=1000, required=False, label="Submit button", initial='button "Log in"'
    )

    question = forms.CharField(
        max_length=500,
        required=False,
        help_text="What the person sees, e.g. Type the code the portal sent by SMS to "
        "{{ params.phone }}. May use {{ params.x }} and {{ outputs.x }}.",
    )
    answer = forms.ChoiceField(
        required=False,
        choices=[
            ("text", "a text"),
            ("code", "a one-time code (masked everywhere, never stored in clear)"),
            ("choice", "one of the options below"),
        ],
        label="The answer is",
    )
    options_text = forms.CharField(
        required=False,
        label="Options",
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="For a choice: one option per line.",
    )
    save_as = forms.CharField(
        max_length=63,
        required=False,
        label="Save the answer as",
        help_text="An output name; later steps use {{ outputs.name }} (a code only as a fill "
        "step's value).",
    )
    answered_by = forms.CharField(
        max_length=150,
        required=False,
        initial="launcher",
        label="Who answers",
        help_text="launcher (who launched the run) or a group's name, e.g. Operators.",
    )
    timeout_minutes = forms.IntegerField(
        min_value=1,
        max_value=24 * 60,
        required=False,
        initial=10,
        label="Wait at most (minutes)",
        help_text="Nobody answered by then: the run fails, saying so.",
    )

    def __init__(self, *args: Any, step_type: str, session: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if step_type not in STEP_TYPES:
            raise ValueError(f"unknown step type {step_type!r}")
        self.step_type = step_type
        keep = [*self.FIELDS[step_type], "id", "description", "timeout_ms"]
        # A session step runs on every bake without anyone's approval: never irreversible, so it
        # has no outcome to wait for either.
        if not session and STEP_CLASSES[STEP_TYPES.index(step_type)].can_be_irreversible:
            keep += ["irreversible", "expect_kind", "expect_value"]
        for field in list(self.fields):
            if field not in keep:
                del self.fields[field]
        # What the step does first; its id, note and limits after.
        self.order_fields(keep)

    @classmethod
    def initial_from_step(cls, step: dict[str, Any]) -> dict[str, Any]:
        initial: dict[str, Any] = {k: v for k, v in step.items() if not isinstance(v, dict | list)}
        for key, field in (
            ("target", "target"),
            ("username", "username_target"),
            ("password", "password_target"),
            ("submit", "submit_target"),
        ):
            if key in step:
                initial[field] = Target.model_validate(step[key]).to_compact()
        expect = step.get("expect")
        if isinstance(expect, dict):
            kind = next((k for k in cls.EXPECT_KINDS if expect.get(k) is not None), "")
            initial["expect_kind"] = kind
            initial["expect_value"] = (
                Target.model_validate(expect["target"]).to_compact()
                if kind == "target"
                else expect.get(kind, "")
            )
        shown = cls.FIELDS.get(step.get("type", ""), ())
        if "target_optional" in shown and "target" in step:
            initial["target_optional"] = initial.pop("target")
        if "condition" in shown:
            if "target" in step:
                initial["condition"] = step.get("state", "visible")
            else:
                initial["condition"] = next(
                    (c for c in ("url", "text", "network_idle") if step.get(c)), "visible"
                )
        if "fields" in step:
            initial["fields_text"] = "\n".join(
                format_extract_field(ExtractField.model_validate(f)) for f in step["fields"]
            )
        if "options" in step:
            initial["options_text"] = "\n".join(step["options"])
        if "checks" in step:
            initial["checks_text"] = "\n".join(
                format_check(CHECK_ADAPTER.validate_python(c)) for c in step["checks"]
            )
        return initial

    def to_data(self) -> dict[str, Any] | None:
        """The step as a dict for the schema, or None with errors added to the form."""
        cleaned = self.cleaned_data
        data: dict[str, Any] = {"id": cleaned["id"], "type": self.step_type}
        for common in ("description", "irreversible", "timeout_ms"):
            if cleaned.get(common) not in (None, ""):
                data[common] = cleaned[common]
        expect = self._expect(cleaned.get("expect_kind") or "", cleaned.get("expect_value") or "")
        if expect is not None:
            data["expect"] = expect
        for field in self.FIELDS[self.step_type]:
            if field in _TARGET_KEYS:
                self._put_target(data, field, cleaned.get(field))
            else:
                self._put_field(data, field, cleaned.get(field))
        if "condition" in self.fields and cleaned.get("condition") not in ("visible", "hidden"):
            data.pop("target", None)
        return None if self.errors else data

    def _put_target(self, data: dict[str, Any], field: str, value: Any) -> None:
        if value:
            try:
                data[_TARGET_KEYS[field]] = Target.from_compact(value).model_dump(
                    exclude_defaults=True
                )
            except ValueError as exc:
                self.add_error(field, _plain(exc))
        elif field != "target_optional":
            data[field.removesuffix("_target")] = None

    def _put_field(self, data: dict[str, Any], field: str, value: Any) -> None:
        if field == "fields_text":
            data["fields"] = self._lines(field, value or "", parse_extract_field)
        elif field == "checks_text":
            data["checks"] = self._lines(field, value or "", parse_check)
        elif field == "condition":
            condition = value or "visible"
            if condition in ("visible", "hidden"):
                data["state"] = condition
            elif condition == "network_idle":
                data["network_idle"] = True
        elif field == "credential":
            data["credential"] = value.name if value else None
        elif field in ("url", "text") and "condition" in self.fields:
            if self.cleaned_data.get("condition") == field:
                data[field] = value or None
        elif field in ("seconds", "timeout_minutes"):
            if value is not None:
                data[field] = value
        elif field == "options_text":
            options = [line.strip() for line in (value or "").splitlines() if line.strip()]
            if options:
                data["options"] = options
        elif field in ("full_page", "dialog", "prompt_text"):
            if value:
                data[field] = True if field == "full_page" else value
        else:
            data[field] = value

    def _expect(self, kind: str, value: str) -> dict[str, Any] | None:
        value = value.strip()
        if not kind and not value:
            return None
        if not kind:
            self.add_error(
                "expect_kind", "say what the expected outcome is: a text, an address or an element"
            )
            return None
        if not value:
            self.add_error(
                "expect_value", f"give the expected {'element' if kind == 'target' else kind}"
            )
            return None
        if kind == "target":
            try:
                return {"target": Target.from_compact(value).model_dump(exclude_defaults=True)}
            except ValueError as exc:
                self.add_error("expect_value", _plain(exc))
                return None
        return {kind: value}

    def _lines(self, field: str, text: str, parse: Any) -> list[dict[str, Any]]:
        items, errors = parse_lines(text, parse)
        for error in errors:
            self.add_error(field, error)
        return items

    def add_schema_errors(self, errors: dict[str, list[str]]) -> None:
        for field, messages in errors.items():
            name = self.SCHEMA_FIELDS.get(field, field)
            if name == "target" and "target" not in self.fields:
                name = "target_optional"
            for message in messages:
                self.add_error(name if name in self.fields else None, message)


class SessionCheckForm(forms.Form):
    """How a session template tells a logged-in browser; its steps are edited like any step."""

    check_url = forms.CharField(
        max_length=2000,
        label="Check page",
        help_text="The page opened before every run to see whether the browser is still logged "
        "in, e.g. the portal's home page. No {{ … }}: it is the same for every run.",
    )
    logged_in = forms.CharField(
        max_length=1000,
        label="Shows when logged in",
        initial='button "Log out"',
        help_text="What that page shows only to a logged-in person. " + TARGET_HELP,
    )
    rebake_every_hours = forms.IntegerField(
        min_value=1,
        max_value=168,
        initial=12,
        label="Log in again every (hours)",
        help_text="A fresh bake on schedule, before the portal's session runs out.",
    )

    def clean_logged_in(self) -> dict[str, Any]:
        try:
            target = Target.from_compact(self.cleaned_data["logged_in"])
        except ValueError as exc:
            raise forms.ValidationError(_plain(exc)) from None
        return target.model_dump(exclude_defaults=True)

    def logged_in_target(self) -> dict[str, Any]:
        value: dict[str, Any] = self.cleaned_data["logged_in"]
        return value


def _plain(exc: Exception) -> str:
    text = str(exc)
    return (
        text.split("\n  ", 1)[-1].removeprefix("Value error, ")
        if "validation error" in text
        else text
    )


class ParameterForm(forms.Form):
    name = forms.RegexField(
        regex=r"^[a-z][a-z0-9_]{0,62}$",
        error_messages={"invalid": "lowercase letters, digits and _, e.g. invoice_number"},
    )
    type = forms.ChoiceField(
        choices=[(t, t) for t in ("string", "number", "money", "date", "enum", "boolean")]
    )
    label = forms.CharField(max_length=200, required=False)
    help = forms.CharField(max_length=500, required=False)
    required = forms.BooleanField(required=False, initial=True)
    default = forms.CharField(max_length=500, required=False)
    min_length = forms.IntegerField(min_value=0, required=False)
    max_length = forms.IntegerField(min_value=1, required=False)
    pattern = forms.CharField(
        max_length=500, required=False, help_text="A regular expression the whole value must match."
    )
    minimum = forms.CharField(max_length=50, required=False)
    maximum = forms.CharField(max_length=50, required=False)
    currency = forms.CharField(max_length=3, required=False, help_text="For money: EUR, USD …")
    decimal_comma = forms.BooleanField(
        required=False,
        label="Decimal comma",
        help_text="For money: amounts are written 1.234,56 instead of 1,234.56.",
    )
    choices = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3}),
        required=False,
        help_text="For enum: one choice per line.",
    )

    def to_data(self) -> dict[str, Any]:
        data = {k: v for k, v in self.cleaned_data.items() if v not in (None, "")}
        data["required"] = bool(self.cleaned_data.get("required"))
        if not data.get("decimal_comma"):
            # Off is the default and applies to money only: absent rather than false.
            data.pop("decimal_comma", None)
        if "choices" in data:
            data["choices"] = lines(data["choices"])
        if "currency" in data:
            data["currency"] = data["currency"].upper()
        return data

    @classmethod
    def initial_from(cls, parameter: dict[str, Any]) -> dict[str, Any]:
        initial = {"required": True, **parameter}
        if "choices" in initial:
            initial["choices"] = "\n".join(initial["choices"])
        return initial


class ImportForm(forms.Form):
    file = forms.FileField(
        help_text="A pandaweb workflow file (.yaml, .yml or .json), at most 1 MB."
    )


class CredentialForm(forms.Form):
    """Write-only: the secret fields are never rendered back (``render_value=False``)."""

    name = forms.SlugField(max_length=63)
    kind = forms.ChoiceField(choices=Credential.Kind.choices)
    description = forms.CharField(max_length=500, required=False)
    username = forms.CharField(
        max_length=300, required=False, widget=forms.TextInput(attrs={"autocomplete": "off"})
    )
    password = forms.CharField(
        max_length=1000,
        required=False,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
    )
    seed = forms.CharField(
        max_length=200,
        required=False,
        label="TOTP seed",
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "off"}),
    )
    token = forms.CharField(
        max_length=4000,
        required=False,
        label="API token",
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "off"}),
    )

    SECRET_FIELDS = ("username", "password", "seed", "token")

    def secret_values(self) -> dict[str, str]:
        return {f: self.cleaned_data.get(f) or "" for f in self.SECRET_FIELDS}


class CredentialValueForm(CredentialForm):
    """Replace a credential's value: only the secret fields of its kind."""

    KIND_FIELDS = {
        Credential.Kind.USERNAME_PASSWORD: ("username", "password"),
        Credential.Kind.TOTP: ("seed",),
        Credential.Kind.API_TOKEN: ("token",),
    }

    def __init__(self, *args: Any, kind: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        keep = self.KIND_FIELDS[Credential.Kind(kind)]
        for field in list(self.fields):
            if field not in keep:
                del self.fields[field]
