"""`eaglespec serve`: an OpenAI-compatible HTTP server (FastAPI + uvicorn) over the generation engine.

Routes: POST /v1/chat/completions, POST /v1/completions (both also as SSE streams), GET /v1/models,
GET /health, GET /metrics (Prometheus). The wire format and its validation live in protocol.py, continuous
batching in scheduler.py; this module turns HTTP requests into scheduler jobs and job events into responses.
See docs/SERVER.md.

Every error is OpenAI-shaped, `{"error": {"message", "type", "param", "code"}}`, with a 4xx status for
anything the client can fix; a bad request never reaches the engine, so it cannot disturb other requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from eaglespec.serve import protocol as P
from eaglespec.config import ConfigError, GenerationConfig, SamplingParams
from eaglespec.datasets import encode_messages
from eaglespec.engine.generate import Engine
from eaglespec.serve import DEFAULT_MAX_MODEL_LEN
from eaglespec.serve.scheduler import SPECULATIVE, VANILLA, Job, QueueFull, Scheduler, ServerMetrics, ShuttingDown

log = logging.getLogger(__name__)

ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics")
MIN_ROOM = 8  # prompt + output slots a sequence must have next to the draft slack (the warm-up needs 4 + 4)
_DISCONNECT_POLL_S = 0.25


@dataclass(frozen=True)
class ServerConfig:
    served_model_name: str
    """The `model` clients must send and that /v1/models lists."""
    max_batch_size: int = 8
    """KV-cache rows per engine: sequences decoded together."""
    max_queue: int = 64
    """Requests that may wait for a free row; beyond that the server answers 429."""
    max_model_len: int = DEFAULT_MAX_MODEL_LEN
    """KV slots per row: prompt + max_tokens + draft-tree slack must fit."""
    api_key: str | None = None
    """If set, every route but /health needs `Authorization: Bearer <api_key>`."""
    max_body_bytes: int = 1 << 20
    """Larger request bodies get 413."""
    warmup: bool = True
    """Run one short request per engine at startup (allocates the KV caches)."""


class ApiError(Exception):
    """An error answered as an OpenAI-style error body."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type = type or ("invalid_request_error" if status < 500 else "server_error")

    def body(self) -> dict:
        return P.ErrorBody(error=P.ErrorDetail(message=self.message, type=self.type, param=self.param,
                                               code=self.code)).model_dump()

    def response(self) -> JSONResponse:
        headers = {"Retry-After": "1"} if self.status in (429, 503) else None
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


# ------------------------------------------------------------------------------------- ASGI middleware


class _Guard:
    """API-key check (every route but /health) and the per-route/status request counter."""

    def __init__(self, app, api_key: str | None, metrics: ServerMetrics):
        self.app = app
        self.api_key = api_key.encode() if api_key else None
        self.metrics = metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        route = scope["path"] if scope["path"] in ROUTES else "other"

        async def counted_send(message) -> None:
            if message["type"] == "http.response.start":
                self.metrics.requests.labels(route, str(message["status"])).inc()
            await send(message)

        if self.api_key is not None and scope["path"] != "/health" and not self._authorized(scope):
            err = ApiError(401, "Incorrect or missing API key: send the header `Authorization: Bearer <key>`",
                           code="invalid_api_key")
            return await err.response()(scope, receive, counted_send)
        await self.app(scope, receive, counted_send)

    def _authorized(self, scope) -> bool:
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.api_key)
        return False


# ----------------------------------------------------------------------------------------------- state


class ServerState:
    """What the handlers share: tokenizer, scheduler, metrics and config."""

    def __init__(self, target, proposer, config: ServerConfig, metrics: ServerMetrics | None = None):
        self.config = config
        self.tokenizer = target.tokenizer
        self.vocab_size = target.model.args.vocab_size
        self.metrics = metrics or ServerMetrics()
        factories = {VANILLA: lambda: Engine(target, None, config.max_batch_size, config.max_model_len)}
        if proposer is not None:
            factories = {SPECULATIVE: lambda: Engine(target, proposer, config.max_batch_size, config.max_model_len),
                         **factories}
        self.scheduler = Scheduler(factories, config.max_queue, self.metrics, warmup=config.warmup)
        for name in self.scheduler.engines:
            max_len, slack = self.scheduler.limits(name)
            if max_len - slack < MIN_ROOM:
                raise ValueError(f"max_model_len {max_len} is too small: the {name} engine reserves {slack} slots "
                                 f"for the tokens being verified and prompt + output need at least {MIN_ROOM} more")
        self.created = P.now()
        self._keys = itertools.count()

    def engine_for(self, speculative: bool | None) -> str:
        has_spec = SPECULATIVE in self.scheduler.engines
        if speculative and not has_spec:
            raise ApiError(400, "speculative: this server runs without a draft head (started with --draft none, "
                                "or no head is shipped for its model)", param="speculative")
        return SPECULATIVE if has_spec and speculative is not False else VANILLA

    def check_model(self, model: str) -> None:
        if model != self.config.served_model_name:
            raise ApiError(404, f"The model `{model}` does not exist; this server serves "
                                f"`{self.config.served_model_name}`", param="model", code="model_not_found")

    def new_job(self, req: P._SamplingRequest, prompt_ids: list[int], prompt_param: str, arrival: float) -> Job:
        """Validate the generation parameters against the context and wrap everything in a Job."""
        engine = self.engine_for(req.speculative)
        max_len, slack = self.scheduler.limits(engine)
        room = max_len - slack - len(prompt_ids)  # the most tokens this prompt leaves for generation
        if room < 1:
            raise ApiError(400, f"{prompt_param}: the prompt has {len(prompt_ids)} tokens but this server's "
                                f"context is {max_len} tokens per sequence ({slack} reserved for the tokens being verified), so at most "
                                f"{max_len - slack - 1} prompt tokens fit", param=prompt_param,
                           code="context_length_exceeded")
        budget = req.budget()
        if budget is not None and budget > room:
            name = "max_completion_tokens" if getattr(req, "max_completion_tokens", None) else "max_tokens"
            raise ApiError(400, f"{name}: {budget} tokens requested, but the prompt ({len(prompt_ids)} tokens) "
                                f"leaves room for at most {room} in this server's context of {max_len} tokens",
                           param=name, code="context_length_exceeded")
        try:
            sampling = SamplingParams(req.temperature, req.top_p, req.top_k, req.seed)
            config = GenerationConfig(budget or room, sampling, req.stop_strings(), req.ignore_eos)
        except ConfigError as e:
            raise ApiError(400, str(e), param=e.param) from None
        return Job(next(self._keys), engine, prompt_ids, config, asyncio.get_running_loop(), arrival=arrival)

    def encode_chat(self, messages: list[P.ChatMessage]) -> list[int]:
        if not getattr(self.tokenizer, "chat_template", None):
            raise ApiError(400, "messages: this model has no chat template; use /v1/completions with a raw prompt",
                           param="messages")
        try:
            return encode_messages(self.tokenizer, [{"role": m.role, "content": m.text()} for m in messages])
        except Exception as e:  # a template may raise on a conversation shape it does not support
            raise ApiError(400, f"messages: the chat template refused this conversation: {e}",
                           param="messages") from None

    def encode_raw(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt)
        bad = [t for t in prompt if not 0 <= t < self.vocab_size]
        if bad:
            raise ApiError(400, f"prompt: token ids {bad[:5]} are outside the vocabulary [0, {self.vocab_size})",
                           param="prompt")
        return list(prompt)


# -------------------------------------------------------------------------------------------- helpers


async def _read_request(request: Request, schema: type[BaseModel], max_bytes: int):
    """Read the body (bounded), check that it is a JSON object and validate it against `schema`."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > max_bytes:
        raise ApiError(413, f"request body of {length} bytes exceeds the limit of {max_bytes} bytes",
                       code="request_too_large")
    body = bytearray()
    async for part in request.stream():
        body += part
        if len(body) > max_bytes:
            raise ApiError(413, f"request body exceeds the limit of {max_bytes} bytes", code="request_too_large")
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ApiError(400, f"the request body is not valid JSON: {e}") from None
    except RecursionError:  # json.loads recurses once per nesting level: `[[[[...` past ~1000 levels
        raise ApiError(400, "the request body is not valid JSON: nested too deeply") from None
    if not isinstance(data, dict):
        raise ApiError(400, f"the request body must be a JSON object, got {type(data).__name__}")
    try:
        req = schema.model_validate_json(bytes(body))
        req.check()
    except ValidationError as e:
        message, param = P.describe_validation_error(e)
        raise ApiError(400, message, param=param) from None
    except P.ParameterError as e:
        raise ApiError(400, str(e), param=e.param, code=e.code) from None
    return req


@contextlib.asynccontextmanager
async def _cancel_on_disconnect(request: Request, job: Job, scheduler: Scheduler):
    """While inside: poll for a client disconnect; on one, cancel the job and post ("gone",) to its events.
    (A streaming response needs no watcher: starlette cancels it when the client goes away.)"""

    async def watch() -> None:
        while not await request.is_disconnected():
            await asyncio.sleep(_DISCONNECT_POLL_S)
        scheduler.cancel(job)
        job.events.put_nowait(("gone",))

    task = asyncio.create_task(watch())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _sse(obj: BaseModel | dict) -> str:
    data = obj.model_dump_json() if isinstance(obj, BaseModel) else json.dumps(obj)
    return f"data: {data}\n\n"


def _usage(c) -> P.Usage:
    st = c.stats
    return P.Usage(prompt_tokens=st.prompt_tokens, completion_tokens=st.new_tokens,
                   total_tokens=st.prompt_tokens + st.new_tokens)


class _Formatter:
    """Builds the response objects of one request for either route."""

    def __init__(self, chat: bool, model: str):
        self.chat, self.model = chat, model
        self.id = P.new_id("chatcmpl" if chat else "cmpl")
        self.created = P.now()

    def final(self, c) -> BaseModel:
        if self.chat:
            choice = P.ChatChoice(message=P.AssistantMessage(content=c.text), finish_reason=c.finish_reason)
            return P.ChatCompletion(id=self.id, created=self.created, model=self.model, choices=[choice],
                                    usage=_usage(c))
        choice = P.CompletionChoice(text=c.text, finish_reason=c.finish_reason)
        return P.Completion(id=self.id, created=self.created, model=self.model, choices=[choice], usage=_usage(c))

    def chunk(self, text: str | None = None, finish_reason: str | None = None, role: bool = False,
              usage: P.Usage | None = None) -> BaseModel:
        """A stream chunk: a text delta, the finish reason, the opening role (chat) or the usage (no choices)."""
        if self.chat:
            choices = [] if usage else [P.ChatChunkChoice(
                delta=P.ChatDelta(role="assistant" if role else None, content=text), finish_reason=finish_reason)]
            return P.ChatCompletionChunk(id=self.id, created=self.created, model=self.model, choices=choices,
                                         usage=usage)
        choices = [] if usage else [P.CompletionChoice(text=text or "", finish_reason=finish_reason)]
        return P.Completion(id=self.id, created=self.created, model=self.model, choices=choices, usage=usage)


class _JobStream(StreamingResponse):
    """An SSE response that cancels its job when the stream ends early (client disconnect or error), even if
    the body iterator never started."""

    def __init__(self, content: AsyncIterator[str], job: Job, scheduler: Scheduler):
        super().__init__(content, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self.job, self.scheduler = job, scheduler

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if not self.job.closed:
                self.scheduler.cancel(self.job)


# ------------------------------------------------------------------------------------------------ app


def create_app(target, proposer, config: ServerConfig, metrics: ServerMetrics | None = None) -> FastAPI:
    """The ASGI app. `target`: a loaded Target; `proposer`: from build_proposer (None = vanilla only).
    The scheduler thread starts and stops with the app's lifespan; `app.state.server` is the ServerState."""
    state = ServerState(target, proposer, config, metrics)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        state.scheduler.start()
        try:
            yield
        finally:
            await asyncio.to_thread(state.scheduler.stop)

    app = FastAPI(title="eaglespec", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = state
    app.add_middleware(_Guard, api_key=config.api_key, metrics=state.metrics)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = f"no route {request.method} {request.url.path}" if exc.status_code in (404, 405) else str(exc.detail)
        return ApiError(exc.status_code, message, code="not_found" if exc.status_code == 404 else None).response()

    @app.get("/health")
    async def health() -> Response:
        if state.scheduler.alive and state.scheduler.ready.is_set():
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": "starting" if state.scheduler.alive else "stopped"}, status_code=503)

    @app.get("/metrics")
    async def metrics_route() -> Response:
        return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        card = P.ModelCard(id=config.served_model_name, created=state.created, max_model_len=config.max_model_len)
        return JSONResponse(P.ModelList(data=[card]).model_dump())

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        arrival = time.perf_counter()
        req = await _read_request(request, P.ChatCompletionRequest, config.max_body_bytes)
        state.check_model(req.model)
        prompt_ids = await asyncio.to_thread(state.encode_chat, req.messages)
        return await _generate(request, req, prompt_ids, "messages", chat=True, arrival=arrival)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        arrival = time.perf_counter()
        req = await _read_request(request, P.CompletionRequest, config.max_body_bytes)
        state.check_model(req.model)
        prompt = req.single_prompt()
        if not prompt or (isinstance(prompt, str) and not prompt.strip()):
            raise ApiError(400, "prompt: the prompt is empty", param="prompt")
        prompt_ids = await asyncio.to_thread(state.encode_raw, prompt)
        return await _generate(request, req, prompt_ids, "prompt", chat=False, arrival=arrival)

    async def _generate(request: Request, req, prompt_ids: list[int], prompt_param: str, chat: bool,
                        arrival: float) -> Response:
        if not prompt_ids:
            raise ApiError(400, f"{prompt_param}: the prompt has no tokens", param=prompt_param)
        job = state.new_job(req, prompt_ids, prompt_param, arrival)
        try:
            state.scheduler.submit(job)
        except QueueFull as e:
            raise ApiError(429, str(e), code="queue_full", type="rate_limit_error") from None
        except ShuttingDown as e:
            raise ApiError(503, str(e), code="unavailable") from None
        fmt = _Formatter(chat, config.served_model_name)
        try:
            async with _cancel_on_disconnect(request, job, state.scheduler):
                # Wait for the first event before answering, so that a failure still gets a proper status.
                event = await job.events.get()
                while not req.stream and event[0] == "chunk":
                    event = await job.events.get()
        except asyncio.CancelledError:
            state.scheduler.cancel(job)
            raise
        if event[0] == "gone":
            return Response(status_code=499)  # nobody reads it: the client closed the connection
        if event[0] == "error":
            job.closed = True
            raise ApiError(event[1], event[2])
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return _JobStream(_stream(job, event, fmt, include_usage), job, state.scheduler)
        job.closed = True
        return JSONResponse(fmt.final(event[1]).model_dump())

    async def _stream(job: Job, first: tuple, fmt: _Formatter, include_usage: bool) -> AsyncIterator[str]:
        if fmt.chat:
            yield _sse(fmt.chunk(text="", role=True))
        event = first
        while True:
            if event[0] == "chunk":
                if event[1].text:
                    yield _sse(fmt.chunk(text=event[1].text))
            elif event[0] == "done":
                job.closed = True
                c = event[1]
                yield _sse(fmt.chunk(finish_reason=c.finish_reason))
                if include_usage:
                    yield _sse(fmt.chunk(usage=_usage(c)))
                break
            elif event[0] == "error":
                job.closed = True
                yield _sse(ApiError(event[1], event[2]).body())
                break
            else:  # "gone": the disconnect watcher fired just before streaming began; the job is cancelled
                return
            event = await job.events.get()
        yield "data: [DONE]\n\n"

    return app


# ------------------------------------------------------------------------------------------------ CLI
