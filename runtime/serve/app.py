"""The HTTP routes of `edgellm serve` (FastAPI): OpenAI's chat and text completions (streaming as server-sent
events, or whole), the model list, health, Prometheus metrics, slot state, and the chat page at /."""
from __future__ import annotations

import json
import secrets
import time
from contextlib import aclosing
from importlib import resources

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from prometheus_client import CollectorRegistry, Counter, Gauge, disable_created_metrics, generate_latest
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from ...errors import EdgeLLMError
from ..python.api import SAMPLING_ARGS, Runtime
from ..python import tools
from . import openai_api as oa
from .guard import MAX_BODY, BodyTooLarge, Guard
from .slots import Finished, SlotPool

# the chat page: its own inline script and style, requests to this server only, no frames, forms or plugins
PAGE_CSP = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; "
            "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400, param: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.message, self.status, self.param, self.kind = message, status, param, kind


class AuthAndCount:
    """ASGI middleware: the API key check (everything but the page and /health) and the request counter. Plain ASGI,
    not BaseHTTPMiddleware, which would buffer streamed responses and hide client disconnects from them."""

    PATHS = ("/", "/health", "/metrics", "/slots")

    def __init__(self, app, api_key: str | None, metrics: Metrics):
        self.app, self.api_key, self.metrics = app, api_key, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        status = {"code": 500}

        async def send_counted(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            auth = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
            if self.api_key and path not in ("/", "/health") and not secrets.compare_digest(
                    auth.encode(), f"Bearer {self.api_key}".encode()):
                await JSONResponse(oa.error_body("missing or wrong API key: send 'Authorization: Bearer <key>'",
                                                 "authentication_error"), status_code=401)(scope, receive, send_counted)
                return
            await self.app(scope, receive, send_counted)
        finally:
            self.metrics.requests.labels(path if path.startswith("/v1/") or path in self.PATHS else "other",
                                         str(status["code"])).inc()


class SSEResponse(Response):
    """Server-sent events from an async generator of str. The generator is always closed (aclosing): when the client
    disconnects, even while this response waits on a full socket, the generation behind it is cancelled at once and
    its slot freed (Starlette's StreamingResponse leaves a suspended generator to the garbage collector)."""

    def __init__(self, events):
        super().__init__(media_type="text/event-stream")
        self.events = events

    async def __call__(self, scope, receive, send):
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]})
        async with anyio.create_task_group() as tg:
            async def watch():
                while (await receive())["type"] != "http.disconnect":
                    pass
                tg.cancel_scope.cancel()

            tg.start_soon(watch)
            try:
                async with aclosing(self.events) as events:
                    async for chunk in events:
                        await send({"type": "http.response.body", "body": chunk.encode(), "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            except OSError:   # the client went away mid-write
                pass
            tg.cancel_scope.cancel()


class Metrics:
    def __init__(self, pool: SlotPool):
        disable_created_metrics()   # no *_created series: they only add noise to a scrape
        r = self.registry = CollectorRegistry()
        self.requests = Counter("edgellm_requests", "HTTP requests served", ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter("edgellm_prompt_tokens", "prompt tokens of finished requests", registry=r)
        self.cached_tokens = Counter("edgellm_prompt_cached_tokens", "prompt tokens reused from a slot's cache",
                                     registry=r)
        self.generated = Counter("edgellm_generated_tokens", "tokens generated", registry=r)
        self.prefill_s = Counter("edgellm_prefill_seconds", "time spent prefilling", registry=r)
        self.decode_s = Counter("edgellm_decode_seconds", "time spent decoding", registry=r)
        self.cancelled = Counter("edgellm_cancelled_requests", "generations stopped by a client disconnect", registry=r)
        self.prefill_tps = Gauge("edgellm_prefill_tokens_per_second", "the last request's prefill speed", registry=r)
        self.decode_tps = Gauge("edgellm_decode_tokens_per_second", "the last request's decode speed", registry=r)
        Gauge("edgellm_requests_running", "requests holding a slot", registry=r).set_function(lambda: pool.busy)
        Gauge("edgellm_requests_waiting", "requests queued for a slot", registry=r).set_function(lambda: pool.waiting)
        Gauge("edgellm_slots", "generation slots", registry=r).set(len(pool.slots))
        mem = pool.runtime.memory()   # the load's memory plan: what --memory-budget became, and what is held
        Gauge("edgellm_memory_budget_bytes", "the memory budget the model loaded with (0: none)",
              registry=r).set(mem["budget"])
        Gauge("edgellm_weights_held_bytes", "weight bytes held in memory (the rest stream from storage)",
              registry=r).set(mem["pinned_bytes"] + mem["window_bytes"])

    def finished(self, r: dict) -> None:
        self.prompt_tokens.inc(r["prompt_tokens"])
        self.cached_tokens.inc(r["cached_tokens"])
        self.generated.inc(len(r["ids"]))
        self.prefill_s.inc(r["prefill_s"])
        self.decode_s.inc(r["decode_s"])
        t = oa.timings(r)
        self.prefill_tps.set(t["prompt_per_second"])
        self.decode_tps.set(t["predicted_per_second"])


def create_app(runtime: Runtime, model_id: str, parallel: int = 1, api_key: str | None = None,
               threads: int | None = None, allowed_hosts=(), allowed_origins=(), max_body: int = MAX_BODY,
               aliases=(), prompt_cache=None) -> FastAPI:
    pool = SlotPool(runtime, parallel, threads, disk=prompt_cache)
    metrics = Metrics(pool)
    app = FastAPI(title="edgellm", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.pool, app.state.runtime, app.state.metrics = pool, runtime, metrics
    max_ctx = runtime.max_context
    names = tuple(dict.fromkeys((model_id, *aliases)))   # the model ids requests may name (OpenAI: 404 otherwise)

    # ---- errors: OpenAI's error object, one line of message ------------------------------------------------------
    def error(status: int, message: str, param: str | None = None, kind: str = "invalid_request_error"):
        return JSONResponse(oa.error_body(message, kind, param), status_code=status)

    @app.exception_handler(BadRequest)
    async def bad_request(request: Request, e: BadRequest):
        return error(e.status, e.message, e.param, e.kind)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, e: RequestValidationError):
        err = e.errors()[0] if e.errors() else {"msg": "invalid request", "loc": ()}
        loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body")
        if err.get("type") == "json_invalid":
            return error(400, "the request body is not valid JSON")
        if err.get("type") == "extra_forbidden":
            return error(400, f"unknown field {loc!r}: not part of the API edgellm serves", loc)
        return error(400, f"{loc}: {err.get('msg')}" if loc else str(err.get("msg")), loc or None)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException):
        return error(e.status_code, str(e.detail), kind="not_found_error" if e.status_code == 404 else "invalid_request_error")

    app.add_middleware(Guard, allowed_hosts=allowed_hosts, allowed_origins=allowed_origins, max_body=max_body)
    if allowed_origins:   # CORS only for the origins the user opened it to (the preflight's answer too)
        app.add_middleware(CORSMiddleware, allow_origins=list(allowed_origins), allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type"])
    app.add_middleware(AuthAndCount, api_key=api_key, metrics=metrics)

    # ---- helpers -------------------------------------------------------------------------------------------------
    def check(req: oa._Request, ids: list[int], plan=None) -> dict:
        """The generation arguments, checked before a slot is taken: a bad request is a 4xx, never a broken stream."""
        why = req.unsupported()
        if why:
            raise BadRequest(why)
        try:
            kwargs = req.sampling()
        except ValueError as e:
            raise BadRequest(str(e), param="stop") from None
        n, m = len(ids), kwargs["max_new_tokens"]
        if n == 0:
            raise BadRequest("the prompt is empty")
        shift = kwargs["context_shift"]   # on: a reply that reaches the context's end goes on past it
        shifting = shift in (True, "on") or (shift is None and runtime.shift[0] == 1)
        if n >= max_ctx or (m is not None and n + m > max_ctx and not shifting):
            raise BadRequest(f"the prompt has {n} tokens{'' if m is None else f' and max_tokens is {m}'}: more than "
                             f"the model's context of {max_ctx} tokens", param="messages" if isinstance(
                                 req, oa.ChatRequest) else "prompt", kind="invalid_request_error")
        try:   # the model's defaults + the C sampler's range checks; no slot is held
            pool.slots[0].ctx.check_generation(m, kwargs["seed"], kwargs["stop"], kwargs["ignore_eos"],
                                               **{k: kwargs[k] for k in SAMPLING_ARGS})
        except EdgeLLMError as e:
            raise BadRequest(str(e)) from None
        if plan is not None:
            if kwargs["response_format"] is not None:
                raise BadRequest("give tools or response_format, not both: the tool calls are the constraint",
                                 param="response_format")
            kwargs.update(grammar=plan.grammar(runtime.text), _raw_text=True)
        if kwargs["response_format"] is not None or kwargs["grammar"] is not None:
            # a schema the grammar engine refuses is the client's error
            from ..python import constrain

            try:
                g = constrain.grammar_for(kwargs["response_format"], kwargs["grammar"])
                if g is not None:
                    constrain.check(runtime, g)
            except EdgeLLMError as e:
                raise BadRequest(str(e), param="tools" if plan else "response_format") from None
        return kwargs

    async def body(request: Request, model):
        try:
            raw = await request.body()
        except BodyTooLarge:
            raise BadRequest(f"the request body is larger than {max_body} bytes (--max-body)", 413) from None
        try:   # parsing a few MB of JSON is CPU work: off the event loop, which serves everyone else
            return await anyio.to_thread.run_sync(model.model_validate_json, raw or b"{}")
        except ValidationError as e:
            raise RequestValidationError(e.errors()) from None

    def chat_ids(req: oa.ChatRequest):
        """The prompt's ids and the request's tool plan (None without tools)."""
        try:
            plan = tools.tool_plan(runtime.text, req.tools, req.tool_choice, req.parallel_tool_calls)
        except EdgeLLMError as e:
            raise BadRequest(str(e), param="tools") from None
        try:
            msgs = tools.template_messages([m.for_template() for m in req.messages])
            prompt = runtime.text.apply_chat_template(msgs, tools=plan.tools if plan else None)
            return runtime.encode(prompt, add_special_tokens=False), plan
        except ValueError as e:
            raise BadRequest(str(e), param="messages") from None
        except EdgeLLMError as e:
            raise BadRequest(str(e), param="messages") from None

    def completion_ids(req: oa.CompletionRequest) -> list[int]:
        if isinstance(req.prompt, list):
            bad = [t for t in req.prompt if not 0 <= t < runtime.vocab]
            if bad:
                raise BadRequest(f"token id {bad[0]} is out of range [0, {runtime.vocab})", param="prompt")
            return list(req.prompt)
        try:
            return runtime.encode(req.prompt)
        except EdgeLLMError as e:
            raise BadRequest(str(e), param="prompt") from None

    async def whole(request: Request, ids: list[int], kwargs: dict) -> dict | None:
        """Runs a generation to its end; None if the client went away first (the generation is then cancelled)."""
        result, failed = None, None
        async with anyio.create_task_group() as tg:
            async def watch():
                while not await request.is_disconnected():
                    await anyio.sleep(0.05)
                metrics.cancelled.inc()
                tg.cancel_scope.cancel()

            tg.start_soon(watch)
            try:
                async with aclosing(pool.generate(ids, kwargs)) as gen:
                    async for item in gen:
                        if isinstance(item, Finished):
                            result = item.result
            except EdgeLLMError as e:   # raised below, outside the task group (which would wrap it in a group)
                failed = str(e)
            tg.cancel_scope.cancel()
        if failed:
            raise BadRequest(failed)
        if result is not None:
            metrics.finished(result)
        return result

    def sse(obj) -> str:
        return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"

    async def streamed(ids: list[int], kwargs: dict, chat: bool, include_usage: bool, plan=None):
        rid = oa.new_id("chatcmpl" if chat else "cmpl")
        obj = "chat.completion.chunk" if chat else "text_completion"
        calls_out = tools.ToolStream(plan) if plan else None   # content streams; calls come whole at the end
        try:
            if chat:
                yield sse(oa.chat_chunk(rid, model_id, {"role": "assistant", "content": ""}))
            async with aclosing(pool.generate(ids, kwargs)) as gen:
                async for item in gen:
                    if not isinstance(item, Finished):
                        if calls_out is not None and not (item := calls_out.push(item)):
                            continue
                        yield sse(oa.chat_chunk(rid, model_id, {"content": item}) if chat
                                  else oa.completion_chunk(rid, model_id, item))
                        continue
                    r = item.result
                    metrics.finished(r)
                    calls = None
                    if calls_out is not None:
                        rest, calls = calls_out.finish()
                        if rest:
                            yield sse(oa.chat_chunk(rid, model_id, {"content": rest}))
                        for delta in oa.tool_call_deltas(calls):
                            yield sse(oa.chat_chunk(rid, model_id, delta))
                    fin = oa.finish_reason(r, calls)
                    yield sse(oa.chat_chunk(rid, model_id, {}, fin) if chat else oa.completion_chunk(rid, model_id, "", fin))
                    if include_usage:
                        yield sse(oa.usage_chunk(rid, model_id, obj, r))
        except EdgeLLMError as e:   # after the headers: the error goes down the stream
            yield sse(oa.error_body(str(e), "server_error"))
        except anyio.get_cancelled_exc_class():
            metrics.cancelled.inc()
            raise
        yield "data: [DONE]\n\n"

    def prepare(req, chat: bool):
        ids, plan = chat_ids(req) if chat else (completion_ids(req), None)
        return ids, check(req, ids, plan), plan

    async def complete(request: Request, chat: bool):
        req = await body(request, oa.ChatRequest if chat else oa.CompletionRequest)
        if req.model is not None and req.model not in names:
            raise BadRequest(f"the model {req.model[:100]!r} is not served here (this server serves "
                             f"{', '.join(map(repr, names))}: GET /v1/models)", 404, "model", "model_not_found")
        # the chat template, the tokenizer and the checks run in a worker thread (the template bounded in time and
        # size: runtime/template_env.py): one heavy request must not stall /health or other clients' streams
        ids, kwargs, plan = await anyio.to_thread.run_sync(prepare, req, chat)
        if req.stream:
            return SSEResponse(streamed(ids, kwargs, chat, req.include_usage(), plan))
        r = await whole(request, ids, kwargs)
        if r is None:   # the client went away
            return PlainTextResponse("", 499)
        if not chat:
            return JSONResponse(oa.completion_response(oa.new_id("cmpl"), model_id, r, req.return_tokens))
        content, calls = plan.parse(r["text"]) if plan else (None, None)
        return JSONResponse(oa.chat_response(oa.new_id("chatcmpl"), model_id, r, req.return_tokens, content, calls))

    # ---- routes --------------------------------------------------------------------------------------------------
    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await complete(request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await complete(request, chat=False)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": n, "object": "model", "created": int(app.state.started),
                                            "owned_by": "edgellm", "meta": {"n_ctx": max_ctx, "slots": parallel}}
                                           for n in names]}

    @app.get("/health")
    async def health():
        return {"status": "ok", "slots_idle": len(pool.slots) - pool.busy, "slots_processing": pool.busy,
                "queue": pool.waiting}

    @app.get("/slots")
    async def slots():
        return [{"id": s.id, "busy": s.busy, "cached_tokens": len(s.ctx.cached), "requests": s.requests,
                 "last_cancel": s.last} for s in pool.slots]

    @app.get("/metrics")
    async def prometheus():
        return PlainTextResponse(generate_latest(metrics.registry).decode(), media_type="text/plain; version=0.0.4")

    page = resources.files(__package__).joinpath("static", "index.html").read_text(encoding="utf-8")

    # the model id goes into a <script>: JSON with <, > and & escaped cannot end it or open a tag
    safe_id = json.dumps(model_id).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    html = page.replace("{{MODEL}}", safe_id).replace("{{CTX}}", str(max_ctx))

    @app.get("/", response_class=HTMLResponse)
    async def index():
        return HTMLResponse(html, headers={"Content-Security-Policy": PAGE_CSP, "X-Content-Type-Options": "nosniff",
                                           "Referrer-Policy": "no-referrer"})

    app.state.started = time.time()
    return app
