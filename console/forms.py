"""The console's forms, including the one generated from an input ticket's JSON schema.

Forms only shape what a person typed into Python values; the rules live in
``runtime.operations`` (``resume`` validates an input answer against the ticket's schema with
jsonschema), so a form that passes here may still be refused there, and the view shows why.

The schema form generator is deliberately small: it covers what tickets ask for in practice
(an object of string / number / integer / boolean / enum properties, or one such value) and
falls back to a JSON text area for anything else (arrays, nested objects, unions). Existing
libraries either need a JavaScript bundle (react-jsonschema-form, django-jsonform) or target
another framework, and a build step is out of scope for the console.
"""

from __future__ import annotations

import json
from typing import Any

from django import forms

from runtime.agents import registry
from runtime.domain.commit import PAUSE_REASON_MAX
from runtime.domain.webhooks import SUBSCRIBABLE
from runtime.operations import VERSION_MAX, reconciliation_problem
from runtime.untrusted import UntrustedJSONError, parse_json

# Example scripts for the scripted demo agent. A response without tool calls ends the run, so
# streamed text that leads to a tool call rides in the same step as the call.
SCRIPT_EXAMPLES: dict[str, dict[str, Any]] = {
    "approval": {
        "steps": [
            {
                "text": "Let me record invoice-42 in the ledger. It needs an approval first.",
                "chunks": 20,
                "delay_ms": 100,
                "tool_calls": [{"name": "ledger_approval", "arguments": {"key": "invoice-42"}}],
            },
            {"text": "Recorded once, after approval.", "chunks": 10, "delay_ms": 50},
        ]
    },
    "input": {
        "steps": [
            {
                "text": "I need to know which account to charge.",
                "chunks": 8,
                "delay_ms": 50,
                "tool_calls": [
                    {
                        "name": "ask_input",
                        "arguments": {
                            "question": "Which account should be charged?",
                            "answer_schema": {
                                "type": "object",
                                "properties": {
                                    "account": {"type": "string", "minLength": 1},
                                    "amount": {"type": "number", "minimum": 0},
                                    "urgent": {"type": "boolean"},
                                    "currency": {"enum": ["EUR", "USD", "GBP"]},
                                },
                                "required": ["account", "amount"],
                            },
                        },
                    }
                ],
            },
            {"text": "Thanks, noted.", "chunks": 5, "delay_ms": 50},
        ]
    },
    "once": {
        "steps": [
            {
                "text": "Recording payment-7 (never retried).",
                "tool_calls": [{"name": "ledger_once", "arguments": {"key": "payment-7"}}],
            },
            {"text": "Done.", "chunks": 3, "delay_ms": 50},
        ]
    },
    "text": {"steps": [{"text": "Hello from the scripted model.", "chunks": 12, "delay_ms": 80}]},
}


class RunFilterForm(forms.Form):
    """Filters of the runs list; every field is optional and unknown values are ignored."""

    state = forms.ChoiceField(
        required=False,
        choices=[
            ("", "any state"),
            ("running", "running"),
            ("awaiting", "awaiting"),
            ("ended", "ended"),
        ],
    )
    cause = forms.ChoiceField(
        required=False,
        label="End cause",
        choices=[("", "any end cause")]
        + [
            (c, c.replace("_", " "))
            for c in ("natural", "step_limit", "cancelled", "stopped", "failed", "indeterminate")
        ],
    )
    agent = forms.CharField(required=False, max_length=100)
    q = forms.CharField(
        required=False,
        max_length=500,
        label="Search",
        help_text="words in the input, answers or tool arguments; or a run, thread or "
        "operation id (prefix)",
    )
    unreconciled = forms.BooleanField(required=False, label="Needs reconciliation")
    paused = forms.BooleanField(required=False, label="Paused")
    since = forms.DateTimeField(
        required=False,
        label="Started from",
        input_formats=["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%d"],
        help_text="UTC",
    )
    until = forms.DateTimeField(
        required=False,
        label="Started before",
        input_formats=["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%d"],
        help_text="UTC",
    )
    tool = forms.CharField(required=False, max_length=200, label="Called tool")
    meta_key = forms.RegexField(
        required=False, max_length=64, regex=r"^[A-Za-z0-9_.-]*$", label="Metadata key"
    )
    meta_value = forms.CharField(required=False, max_length=500, label="Metadata value")
    parent = forms.RegexField(
        required=False, max_length=32, regex=r"^[0-9A-Za-z_-]*$", label="Parent run"
    )
    after = forms.CharField(required=False, max_length=100, widget=forms.HiddenInput)
    top = forms.CharField(required=False, max_length=100, widget=forms.HiddenInput)


class InboxFilterForm(forms.Form):
    """Filters of the inbox; every field is optional and unknown values are ignored."""

    kind = forms.ChoiceField(
        required=False,
        choices=[("", "any kind")] + [(k, k) for k in ("approval", "input", "delegation", "timer")],
    )
    tool = forms.CharField(required=False, max_length=200)
    agent = forms.CharField(required=False, max_length=100)
    older_than = forms.TypedChoiceField(
        required=False,
        label="Age",
        coerce=int,
        empty_value=None,
        choices=[
            ("", "any age"),
            ("5", "older than 5 min"),
            ("60", "older than 1 h"),
            ("1440", "older than 1 day"),
        ],
    )
    after = forms.CharField(required=False, max_length=100, widget=forms.HiddenInput)


def agent_choices() -> list[tuple[str, str]]:
    return [(name, name) for name in sorted(registry())]


class StartRunForm(forms.Form):
    agent = forms.ChoiceField(choices=agent_choices)
    input = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 4}),
        max_length=100_000,
        help_text="The user message the run starts with.",
    )
    script = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 12, "spellcheck": "false", "class": "mono"}),
        help_text='JSON for a scripted agent: {"steps": [...]}. Leave empty for a real model.',
    )
    thread_id = forms.CharField(
        required=False,
        max_length=32,
        label="Thread id",
        help_text="Optional: continue an existing thread (it must have no active run).",
    )

    def clean_script(self) -> dict[str, Any] | None:
        raw = self.cleaned_data["script"].strip()
        if not raw:
            return None
        try:
            value = parse_json(raw, "the script")
        except UntrustedJSONError as exc:
            raise forms.ValidationError(str(exc)) from exc
        if not isinstance(value, dict):
            raise forms.ValidationError('the script is a JSON object: {"steps": [...]}')
        return value

    def clean_thread_id(self) -> str | None:
        return self.cleaned_data["thread_id"].strip() or None

    def clean(self) -> dict[str, Any]:
        """Refuse a script for an agent that answers with a real model: a run that carries a
        script always uses the scripted model (docs/real-models.md), and the form comes filled
        with a demo script, so a newcomer who picked their own agent got the demo's answers
        without a word. The API still takes a script for any agent, on purpose."""
        data = super().clean() or {}
        agent = registry().get(data.get("agent") or "")
        if data.get("script") is not None and agent and agent.provider.kind != "scripted":
            self.add_error(
                "script",
                f"agent '{agent.name}' answers with its model ({agent.provider.kind}); a "
                "script would replace the model for this run. Empty this field to use it.",
            )
        return data


class CancelForm(forms.Form):
    reason = forms.CharField(required=False, max_length=PAUSE_REASON_MAX)
    confirm = forms.BooleanField(
        required=True, error_messages={"required": "Confirm that the run should be cancelled."}
    )


class WebhookConfirmForm(forms.Form):
    """The confirmation a webhook endpoint's delete or secret rotation needs."""

    confirm = forms.BooleanField(
        required=True, error_messages={"required": "Confirm the change: it takes effect at once."}
    )


class PauseForm(forms.Form):
    """Pause or resume a run: the reason is recorded with the committed fact."""

    reason = forms.CharField(required=False, max_length=500)


class MoveForm(forms.Form):
    """Move runs of ``agent`` (those on ``from_version`` when given) to the version of it
    the server carries; the reason is recorded with each committed move."""

    agent = forms.CharField(max_length=100)
    from_version = forms.CharField(required=False, max_length=VERSION_MAX)
    reason = forms.CharField(required=False, max_length=PAUSE_REASON_MAX)


class ReconcileForm(forms.Form):
    OUTCOMES = [
        ("applied", "Applied: the downstream system shows the effect"),
        ("not_applied", "Not applied: the downstream system has no trace of it"),
        ("unknown", "Still unknown"),
    ]
    outcome = forms.ChoiceField(choices=OUTCOMES, widget=forms.RadioSelect)
    evidence = forms.CharField(
        required=False,
        max_length=5000,
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="What the downstream system says (a reference, a query result).",
    )
    correction = forms.BooleanField(
        required=False,
        label="This corrects the earlier record",
        help_text="Needed when the outcome contradicts one already recorded.",
    )
    follow_up_agent = forms.ChoiceField(
        required=False,
        label="Start a follow-up run",
        help_text="Starts a new run on the thread with this outcome as its input.",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        follow_up = self.fields["follow_up_agent"]
        assert isinstance(follow_up, forms.ChoiceField)
        follow_up.choices = [("", "no follow-up run")] + agent_choices()

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        assert data is not None  # Form.clean returns cleaned_data
        problem = reconciliation_problem(data.get("outcome") or "", data.get("evidence") or "")
        if problem is not None:
            self.add_error("evidence", problem)
        return data


class ReconcileFilterForm(forms.Form):
    """Filters of the Reconcile queue; every field is optional and unknown values are ignored.

    ``older_than`` is in minutes since the call was sealed; ``reason`` is a key of
    ``runtime.inventory.SEAL_REASONS``; ``run`` is a run id or its prefix.
    """

    show = forms.ChoiceField(
        required=False, choices=[("open", "to check"), ("all", "all")], initial="open"
    )
    tool = forms.CharField(required=False, max_length=200)
    agent = forms.CharField(required=False, max_length=100)
    run = forms.RegexField(required=False, max_length=32, regex=r"^[0-9A-Za-z_-]*$", label="Run")
    older_than = forms.TypedChoiceField(
        required=False,
        label="Age",
        coerce=int,
        empty_value=None,
        choices=[
            ("", "any age"),
            ("60", "sealed over 1 h ago"),
            ("1440", "sealed over 1 day ago"),
            ("10080", "sealed over 7 days ago"),
        ],
    )
    reason = forms.ChoiceField(required=False, choices=[("", "any reason")])
    after = forms.CharField(required=False, max_length=100, widget=forms.HiddenInput)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        from runtime.inventory import SEAL_REASONS

        super().__init__(*args, **kwargs)
        reason = self.fields["reason"]
        assert isinstance(reason, forms.ChoiceField)
        reason.choices = [("", "any reason")] + [(k, v[0]) for k, v in SEAL_REASONS.items()]


class TokenForm(forms.Form):
    name = forms.CharField(max_length=100, required=False, help_text="What the token is for.")


# -- the input form generated from a ticket's JSON schema ----------------------------------------

DENY_REASON_MAX = 2000


class DenyForm(forms.Form):
    reason = forms.CharField(
        required=False,
        max_length=DENY_REASON_MAX,
        widget=forms.TextInput(attrs={"placeholder": "why (shown to the model)"}),
    )


class JSONTextField(forms.CharField):
    """A JSON value typed as text (the fallback for schema parts the generator does not model)."""

    widget = forms.Textarea(attrs={"rows": 3, "class": "mono", "spellcheck": "false"})

    def to_python(self, value: Any) -> Any:
        text = super().to_python(value)
        if text is None or text in self.empty_values:
            return None
        try:
            return parse_json(text, "the value")
        except UntrustedJSONError as exc:
            raise forms.ValidationError(str(exc)) from exc


class BooleanChoiceField(forms.TypedChoiceField):
    """A JSON boolean answered explicitly (yes / no), so "false" is a real answer."""

    def __init__(self, **kwargs: Any) -> None:
        required = kwargs.pop("required", False)
        super().__init__(
            choices=[("", "—"), ("true", "yes"), ("false", "no")]
            if not required
            else [("true", "yes"), ("false", "no")],
            coerce=lambda v: v == "true",
            empty_value=None,
            required=required,
            **kwargs,
        )


def _label(name: str, schema: dict[str, Any]) -> str:
    return str(schema.get("title") or name.replace("_", " "))


def schema_field(name: str, schema: Any, *, required: bool) -> forms.Field:
    """One form field for one JSON-schema value (see the module docstring for the cover)."""
    if not isinstance(schema, dict):
        schema = {}
    common: dict[str, Any] = {
        "label": _label(name, schema),
        "required": required,
        "help_text": str(schema.get("description") or ""),
    }
    kind = schema.get("type")
    if "enum" in schema and isinstance(schema["enum"], list) and schema["enum"]:
        choices = [(json.dumps(v), str(v) if not isinstance(v, str) else v) for v in schema["enum"]]
        # An empty first choice even when required: an untouched form must not send the
        # first value as if someone had chosen it (issue 11, defect 6).
        choices = [("", "— choose —" if required else "—"), *choices]
        return forms.TypedChoiceField(
            choices=choices, coerce=json.loads, empty_value=None, **common
        )
    if "const" in schema:
        value = schema["const"]
        return forms.TypedChoiceField(
            choices=[(json.dumps(value), str(value))], coerce=json.loads, **common
        )
    if kind == "string":
        max_length = schema.get("maxLength")
        widget = (
            forms.Textarea(attrs={"rows": 3})
            if (max_length or 0) > 200
            or (max_length is None and schema.get("format") == "textarea")
            else forms.TextInput
        )
        field = forms.CharField(
            min_length=schema.get("minLength"),
            max_length=max_length,
            strip=False,
            widget=widget,
            **common,
        )
        if "pattern" in schema:
            field.widget.attrs["pattern"] = schema["pattern"]
        if schema.get("format") == "email":
            field.widget.input_type = "email"
        return field
    if kind == "integer":
        return forms.IntegerField(
            min_value=schema.get("minimum"), max_value=schema.get("maximum"), **common
        )
    if kind == "number":
        number = forms.FloatField(
            min_value=schema.get("minimum"), max_value=schema.get("maximum"), **common
        )
        number.widget.attrs["step"] = "any"
        return number
    if kind == "boolean":
        return BooleanChoiceField(**common)
    common["help_text"] = (common["help_text"] + " " if common["help_text"] else "") + (
        "Type a JSON value."
    )
    return JSONTextField(**common)


class SchemaForm(forms.Form):
    """Fields generated from a JSON schema; ``answer()`` is the JSON value to send.

    An object schema with ``properties`` becomes one field per property (in schema order);
    any other schema becomes a single field named ``value``. Optional fields left empty are
    left out of the answer. ``prefix`` keeps the generated names apart from the ticket form's
    own fields.
    """

    VALUE = "value"

    def __init__(
        self, schema: Any, *args: Any, order: list[str] | None = None, **kwargs: Any
    ) -> None:
        kwargs.setdefault("prefix", "answer")
        super().__init__(*args, **kwargs)
        self.schema = schema if isinstance(schema, dict) else {}
        properties = self.schema.get("properties")
        self.is_object = self.schema.get("type", "object") == "object" and isinstance(
            properties, dict
        )
        if self.is_object:
            assert isinstance(properties, dict)
            required = set(self.schema.get("required") or ())
            names = (
                sorted(properties, key=lambda n: (order or []).index(n)) if order else properties
            )
            for name in names:
                sub = properties[name]
                self.fields[name] = schema_field(name, sub, required=name in required)
        else:
            self.fields[self.VALUE] = schema_field("answer", self.schema, required=True)

    def answer(self) -> Any:
        """The typed answer; call after ``is_valid()``."""
        data = self.cleaned_data
        if not self.is_object:
            return data.get(self.VALUE)
        return {
            name: value
            for name, value in data.items()
            if not (value is None or (value == "" and not self.fields[name].required))
        }


def _find_properties(value: Any, names: set[str]) -> list[str] | None:
    if isinstance(value, dict):
        properties = value.get("properties")
        if isinstance(properties, dict) and set(properties) == names:
            return list(properties)
        found = (_find_properties(v, names) for v in value.values())
        return next((f for f in found if f is not None), None)
    if isinstance(value, list):
        return next((f for f in (_find_properties(v, names) for v in value) if f), None)
    return None


def schema_order(schema: Any, raw_arguments: str) -> list[str] | None:
    """The schema's property names in the order the model wrote them, or None if unknown.

    ``raw_arguments`` is the call's argument text as the model sent it; a JSON object whose
    ``properties`` has exactly the schema's names gives the order (JSON parsing keeps key
    order, while PostgreSQL's jsonb does not).
    """
    properties = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(properties, dict) or not raw_arguments:
        return None
    try:
        parsed = json.loads(raw_arguments)
    except (json.JSONDecodeError, ValueError):
        return None
    return _find_properties(parsed, set(properties))


class WebhookForm(forms.Form):
    """A webhook endpoint: where to POST and which event kinds (runtime.webhooks)."""

    name = forms.CharField(max_length=100, required=False)
    url = forms.URLField(max_length=2000, assume_scheme="https", help_text="http(s) URL")
    events = forms.MultipleChoiceField(
        choices=[(e.value, e.value) for e in SUBSCRIBABLE],
        widget=forms.CheckboxSelectMultiple,
        help_text="The event kinds it receives.",
    )
