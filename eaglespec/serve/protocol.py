"""The OpenAI-compatible wire format of `eaglespec serve`: request and response schemas (pydantic v2).

Requests are parsed strictly (`extra="forbid"`, no type coercion, no NaN/inf): an unknown field, a wrong type
or a parameter this server cannot honour is a 400 naming the parameter, never silently ignored. Parameters
that OpenAI defines but the runtime does not implement (n > 1, logprobs, tools, penalties, ...) are declared
here so that their neutral values are accepted and anything else is refused by `check()`.

Extensions (not in OpenAI's API; the openai client sends them with `extra_body=`):
  top_k        keep the k most likely tokens (0 = off)
  speculative  false = decode this request without the draft head; true = require speculation;
               absent = the server's default (speculative when it has a draft head)
  ignore_eos   keep generating past EOS (fixed-length benchmarks)
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

MAX_STOP_STRINGS = 16


class ParameterError(ValueError):
    """A parameter value refused after schema validation: one this server does not implement (code
    "unsupported_parameter") or one that contradicts another parameter (code None)."""

    def __init__(self, param: str, message: str, code: str | None = "unsupported_parameter"):
        super().__init__(message)
        self.param, self.code = param, code


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


# --------------------------------------------------------------------------------------------- requests


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]

    def text(self) -> str:
        """Plain text of the message (text parts joined by newlines)."""
        return self.content if isinstance(self.content, str) else "\n".join(p.text for p in self.content)


class StreamOptions(_Strict):
    include_usage: bool = False
    """Send a last chunk (empty `choices`) with the request's token usage before `data: [DONE]`."""


class _SamplingRequest(_Strict):
    """Fields shared by /v1/chat/completions and /v1/completions."""

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    """Generated-token budget; default: what is left of the context after the prompt."""
    # Values are checked by the one rule set, `config.SamplingParams` (a 400 naming them); the API only adds
    # OpenAI's upper bound of the temperature.
    temperature: float = Field(default=1.0, le=2.0)
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**64)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    """An end-user identifier (OpenAI's abuse monitoring); it does not affect generation."""
    speculative: bool | None = None
    ignore_eos: bool = False
    # Declared only so that their neutral values pass; see check().
    n: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None

    def stop_strings(self) -> tuple[str, ...]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > MAX_STOP_STRINGS:
            raise ParameterError("stop", f"stop: at most {MAX_STOP_STRINGS} stop strings, got {len(stops)}", None)
        if any(s == "" for s in stops):
            raise ParameterError("stop", "stop: stop strings must be non-empty", None)
        return tuple(stops)

    def budget(self) -> int | None:
        return self.max_tokens

    def check(self) -> None:
        """Checks pydantic cannot express: raise ParameterError for the first parameter whose value this
        server cannot honour or that contradicts another one."""
        self.stop_strings()
        self.budget()
        if self.n not in (None, 1):
            raise ParameterError("n", f"n: only n=1 is supported, got {self.n}")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) not in (None, 0.0):
                raise ParameterError(name, f"{name}: penalties are not supported (only 0)")
        if self.logit_bias:
            raise ParameterError("logit_bias", "logit_bias is not supported")
        if self.stream_options is not None and not self.stream:
            raise ParameterError("stream_options", "stream_options is only allowed with stream: true", None)


class ChatCompletionRequest(_SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    functions: list[Any] | None = None
    function_call: Any = None
    response_format: dict[str, Any] | None = None

    def budget(self) -> int | None:
        if (self.max_tokens is not None and self.max_completion_tokens is not None
                and self.max_tokens != self.max_completion_tokens):
            raise ParameterError("max_completion_tokens",
                                 "max_tokens and max_completion_tokens disagree: give one of them", None)
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def check(self) -> None:
        super().check()
        if self.logprobs or self.top_logprobs:
            raise ParameterError("logprobs" if self.logprobs else "top_logprobs", "logprobs are not supported")
        for name in ("tools", "functions"):
            if getattr(self, name):
                raise ParameterError(name, f"{name}: tool/function calling is not supported")
        for name in ("tool_choice", "function_call"):
            if getattr(self, name) not in (None, "none"):
                raise ParameterError(name, f"{name}: tool/function calling is not supported")
        if self.parallel_tool_calls:
            raise ParameterError("parallel_tool_calls", "parallel_tool_calls: tool calling is not supported")
        if self.response_format not in (None, {"type": "text"}):
            raise ParameterError("response_format", "response_format: only {\"type\": \"text\"} is supported")


class CompletionRequest(_SamplingRequest):
    prompt: str | list[int] | list[str] | list[list[int]]
    """A string or a list of token ids; a list of several prompts (batched prompts) is refused."""
    echo: bool = False
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None

    def single_prompt(self) -> str | list[int]:
        p = self.prompt
        if isinstance(p, str) or not p or isinstance(p[0], int):
            return p
        if len(p) != 1:
            raise ParameterError("prompt", f"prompt: one prompt per request (n=1), got a list of {len(p)}")
        return p[0]

    def check(self) -> None:
        super().check()
        self.single_prompt()
        if self.echo:
            raise ParameterError("echo", "echo is not supported")
        if self.logprobs is not None:
            raise ParameterError("logprobs", "logprobs are not supported")
        if self.best_of not in (None, 1):
            raise ParameterError("best_of", "best_of: only 1 is supported")
        if self.suffix:
            raise ParameterError("suffix", "suffix (insertion) is not supported")


_UNION_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}


def describe_validation_error(e: ValidationError) -> tuple[str, str]:
    """(message, param) for the most useful error of a failed request validation."""
    errors = e.errors(include_url=False)
    err = next((x for x in errors if x["type"] == "extra_forbidden"), errors[0])
    # Drop union-branch tags ("str", "list[TextPart]", ...) from the location: keep field names and indices.
    loc = [str(p) for p in err["loc"]
           if not (isinstance(p, str) and (p in _UNION_TAGS or "[" in p or p[:1].isupper()))]
    param = ".".join(loc) or None
    if err["type"] == "extra_forbidden":
        return f"Unrecognized request argument supplied: {param}", param
    return (f"{param}: {err['msg']}" if param else err["msg"]), param


# -------------------------------------------------------------------------------------------- responses


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    """Generated tokens, counting the EOS token or the token that completed a stop string."""
    total_tokens: int


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: None = None
    finish_reason: Literal["stop", "length"]


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: str | None = None


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChatDelta
    logprobs: None = None
    finish_reason: Literal["stop", "length"] | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: None = None
    finish_reason: Literal["stop", "length"] | None = None


class Completion(BaseModel):
    """Also the streamed chunk of /v1/completions (same object, `finish_reason` null until the end)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "eaglespec"
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(BaseModel):
    error: ErrorDetail


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())
