"""A scripted model: replays a JSON script of responses given per run, with no network.

Script shape (DESIGN.md "Contracts"): ``{"steps": [step, ...]}`` where a step is
``{"text": "...", "chunks": N, "delay_ms": M}``,
``{"tool_calls": [{"name", "arguments"}], "text"?}`` or
``{"error": "retryable" | "fatal", "times": N}``. An error step makes the *next* response fail
that many attempts first (a fatal one fails for good). When the script runs out the model
answers ``FINAL_TEXT``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any, Literal, NoReturn

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    ValidationError,
)

from runtime.errors import ScriptRefused
from runtime.providers.base import (
    Delta,
    InferenceContext,
    InferenceRequest,
    InferenceResult,
    ModelError,
    ToolCallOut,
)

FINAL_TEXT = "The scripted model has nothing more to say."


class _Strict(BaseModel):
    # Strict: a script is JSON, and `"chunks": true` or `"2"` is a mistake, not a number.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class ScriptedToolCall(_Strict):
    name: Annotated[str, Field(min_length=1, max_length=200)]
    arguments: dict[str, Any] | str = Field(default_factory=dict)


class TextStep(_Strict):
    text: str
    chunks: Annotated[int, Field(ge=1, le=10_000)] = 1
    delay_ms: Annotated[int, Field(ge=0, le=60_000)] = 0


class ToolCallsStep(_Strict):
    tool_calls: Annotated[list[ScriptedToolCall], Field(min_length=1, max_length=64)]
    text: str = ""
    chunks: Annotated[int, Field(ge=1, le=10_000)] = 1
    delay_ms: Annotated[int, Field(ge=0, le=60_000)] = 0


class ErrorStep(_Strict):
    error: Literal["retryable", "fatal"]
    times: Annotated[int, Field(ge=1, le=100)] = 1


# The key that only that kind of step has, in the order a step is judged by.
STEP_KINDS = ("error", "tool_calls", "text")


def _step_kind(value: Any) -> str | None:
    """Which step ``value`` is, by the key that only that kind has (None: no kind)."""
    if isinstance(value, dict):
        return next((key for key in STEP_KINDS if key in value), None)
    return None


# A step is judged as the one kind its keys name, so a bad step gets that kind's errors, not
# every kind's.
Step = Annotated[
    Annotated[ErrorStep, Tag("error")]
    | Annotated[ToolCallsStep, Tag("tool_calls")]
    | Annotated[TextStep, Tag("text")],
    Discriminator(
        _step_kind,
        custom_error_type="step_kind",
        custom_error_message="a step is an object with text, tool_calls or error",
    ),
]


class Script(_Strict):
    steps: Annotated[list[Step], Field(max_length=1000)]


_SCRIPT = TypeAdapter(Script)


def parse_script(data: Any, *, text_ends_run: bool = False) -> Script:
    """Validate a script (a dict from run metadata); return it as a Script.

    A step after a fatal error step is refused as never used (that error ends the run), and
    so, with ``text_ends_run`` (the run's agent has no ``step_end`` hook that goes on after
    a text-only answer), is a step after a text-only step.

    Raises ScriptRefused naming each problem by where it is (``steps.0.text: Field
    required``); ``detail["errors"]`` lists them as ``{"loc": [...], "msg": str}``.
    """
    try:
        script = _SCRIPT.validate_python(data)
    except ValidationError as exc:
        problems = [{"loc": _where(e["loc"]), "msg": e["msg"]} for e in exc.errors()]
        _refuse(problems, exc)
    for index, step in enumerate(script.steps[:-1]):
        if isinstance(step, ErrorStep) and step.error == "fatal":
            _refuse_after(index, "fails for good")
        if text_ends_run and isinstance(step, TextStep):
            _refuse_after(index, "answers with text only")
    return script


def _refuse_after(index: int, why: str) -> NoReturn:
    problem = f"never used: steps.{index} {why}, which ends the run"
    _refuse([{"loc": ["steps", index + 1], "msg": problem}])


def _refuse(problems: list[dict[str, Any]], cause: Exception | None = None) -> NoReturn:
    said = "; ".join(f"{'.'.join(map(str, p['loc'])) or 'script'}: {p['msg']}" for p in problems)
    raise ScriptRefused(f"the script is malformed: {said}", errors=problems) from cause


def _where(loc: tuple[int | str, ...]) -> list[int | str]:
    """An error's place in the script, without the kind a step was judged as (its own key
    already says it: ``steps.0.tool_calls.0.name``, not ``steps.0.tool_calls.tool_calls...``)."""
    if len(loc) > 2 and loc[0] == "steps" and loc[2] in STEP_KINDS:
        return [*loc[:2], *loc[3:]]
    return list(loc)


def _responses(script: Script) -> list[tuple[list[ErrorStep], TextStep | ToolCallsStep]]:
    out, pending = [], []
    for step in script.steps:
        if isinstance(step, ErrorStep):
            pending.append(step)
        else:
            out.append((pending, step))
            pending = []
    if pending:
        out.append((pending, TextStep(text=FINAL_TEXT)))
    return out


def _split(text: str, parts: int) -> list[str]:
    size = max(1, -(-len(text) // parts)) if text else 1
    return [text[i : i + size] for i in range(0, len(text), size)] or []


class ScriptedProvider:
    name = "scripted"

    def __init__(self, script: Script) -> None:
        self.responses = _responses(script)

    async def infer(self, request: InferenceRequest, ctx: InferenceContext) -> InferenceResult:
        if ctx.step > len(self.responses):
            return await self._stream(TextStep(text=FINAL_TEXT), ctx)
        errors, response = self.responses[ctx.step - 1]
        failed = 0
        for error in errors:
            if error.error == "fatal":
                raise ModelError("scripted fatal error", provider=self.name, retryable=False)
            failed += error.times
            if ctx.attempt <= failed:
                raise ModelError(
                    f"scripted retryable error (attempt {ctx.attempt} of {failed} failing)",
                    provider=self.name,
                    retryable=True,
                )
        return await self._stream(response, ctx)

    async def _stream(
        self, step: TextStep | ToolCallsStep, ctx: InferenceContext
    ) -> InferenceResult:
        pause = step.delay_ms / 1000
        said = ""
        for piece in _split(step.text, step.chunks):
            said += piece
            if pause:
                # A slow stream checkpoints its text like a network provider, so a viewer who
                # joins late is shown the opening words (console.consumers, "hello"). The
                # checkpoint goes first: a viewer joining in between sees a piece twice,
                # never a gap.
                ctx.checkpoint(said, [])
            ctx.on_delta(Delta(kind="text", text=piece))
            if pause:
                await asyncio.sleep(pause)
        calls = []
        for index, call in enumerate(getattr(step, "tool_calls", [])):
            arguments = (
                call.arguments
                if isinstance(call.arguments, str)
                else json.dumps(call.arguments, sort_keys=True)
            )
            call_id = f"call_{ctx.step}_{index}"
            ctx.on_delta(Delta(kind="tool_call", index=index, name=call.name, call_id=call_id))
            for piece in _split(arguments, step.chunks):
                ctx.on_delta(Delta(kind="tool_call", index=index, text=piece))
                if pause:
                    await asyncio.sleep(pause)
            calls.append(ToolCallOut(id=call_id, name=call.name, arguments=arguments))
        return InferenceResult(
            text=step.text,
            tool_calls=tuple(calls),
            finish_reason="tool_calls" if calls else "stop",
            usage={"input_tokens": 0, "output_tokens": len(step.text.split())},
        )


def from_config(config: Any) -> ScriptedProvider:
    """The ``scripted`` kind of an agent: a run without a script of its own has nothing to
    say (FINAL_TEXT); a run that carries one is answered by it (``build_provider``)."""
    return ScriptedProvider(parse_script({"steps": []}))


from_config.shared = False  # type: ignore[attr-defined]  # responses are per run
