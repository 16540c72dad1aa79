"""An OpenAI-compatible endpoint for a run's model (`llmtui serve`, transformers backend), on
transformers' own server (transformers.cli.serving: FastAPI + uvicorn, its generation engine).

    python -m tuiapp.trainer.tools.openai_server RUN_DIR --port P [--host H] [--model-id ID] [--checkpoint N]

transformers' app answers `POST /v1/chat/completions` through its handler classes and runs every
generation on its engine (GenerationState: one inference thread per model, requests queued to it).
What llmtui adds sits around that app:

- the run -> model: RunModels, transformers' ModelManager holding one model, the run's, loaded
  exactly as `llmtui chat` loads it (tuiapp.trainer.tools.inference: the full model or the adapter
  on its base); RunChat prompts it through the chat template it trained with and answers with the
  run's [generate] table as defaults;
- the guard (an ASGI middleware in front of the app): the API key ($LLMTUI_SERVE_TOKEN, a Bearer
  token on every /v1 request, 401 otherwise), 503 while the model loads, the body bounded by the
  bytes read (8 MB: 413 past it), JSON that does not parse a 400, more than MAX_WAITING requests in
  the server a 503, one line per request in serve.log (no token, no health polls);
- the prompt bound (prompt tokens + max_tokens within the model's context, a 400 saying why),
  `stop` strings cut out of the answer, OpenAI's error shapes;
- `POST /v1/completions` with vLLM's prompt_logprobs (completions.py; transformers' own route takes
  text prompts only and gives no logprobs), `GET /v1/models` (the one model, named by --model-id,
  the run id), `GET /health` ({"status": "loading" | "ok"}: 503 while the model loads).

The port is taken before the model loads, so a second server on it fails at once; SIGTERM ends the
server (an answer being streamed is cut after a short grace).

Continuous batching (transformers' paged attention) is not used. It runs here, on CPU and with a
peft model (the tiny model with a LoRA adapter answered through init_continuous_batching), but in
transformers 5.23 the server's CBGenerateManager builds the batch from the first request's generation
config (init_cb) and hands later requests only max_new_tokens and eos_token_id: greedy or sampled,
temperature, top_p and repetition_penalty would be the first request's for every later one, and
stop strings are not supported. The regular path answers each request with its own settings, one
generation at a time on the engine's inference thread (GenerateManager), so no lock of ours is needed.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import hmac
import json
import os
import socket
import sys
import threading
import time

from tuiapp.core.common import trainer_tools
from tuiapp.core.common.errors import UserError

TOKEN_ENV = "LLMTUI_SERVE_TOKEN"  # tuiapp.core.store.served.TOKEN_ENV
MAX_BODY = 8 * 1024 * 1024
BACKLOG = 2048  # connections the kernel queues before accept
MAX_WAITING = int(os.environ.get("LLMTUI_SERVE_MAX_WAITING", "512"))  # requests in the server; more: 503
GRACE_S = 3  # SIGTERM: how long answers being given may go on
DEFAULT_CONTEXT = 2048  # a model whose config names no context length


class ApiError(Exception):
    def __init__(self, status: int, message: str, code: str = "invalid_request_error", param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param

    def body(self) -> dict:
        kind = "authentication_error" if self.status == 401 else \
            "server_error" if self.status >= 500 else "invalid_request_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


class StopFilter:
    """Text pieces with the `stop` strings cut: what may be the start of a stop string is held back
    until the next piece shows it is not; once one appears, nothing after it passes."""

    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self.pending = ""
        self.hit = False

    def feed(self, text: str) -> str:
        if self.hit:
            return ""
        self.pending += text
        for stop in self.stops:
            at = self.pending.find(stop)
            if at >= 0:
                self.hit = True
                out, self.pending = self.pending[:at], ""
                return out
        hold = max((n for s in self.stops for n in range(1, len(s)) if self.pending.endswith(s[:n])), default=0)
        out = self.pending[:len(self.pending) - hold]
        self.pending = self.pending[len(out):]
        return out

    def flush(self) -> str:
        out, self.pending = ("" if self.hit else self.pending), ""
        return out


class Endpoint:
    """The run's model and what llmtui checks before a request reaches the engine."""

    def __init__(self, run_dir, checkpoint: int | None, model_id: str, token: str | None):
        self.run_dir, self.checkpoint, self.model_id, self.token = run_dir, checkpoint, model_id, token
        self.root = None  # the model's folder, as vLLM's /v1/models names it
        self.loaded = None
        self.recipe = None
        self.created = int(time.time())
        self.tokenizer_lock = threading.Lock()  # a fast tokenizer refuses concurrent use ("Already borrowed")
        self.counter = None  # a copy of the tokenizer: prompts are counted beside the one decoding
        self.context = DEFAULT_CONTEXT
        self.token_bytes = 1  # the longest token's UTF-8 bytes: prompt bytes / it ≤ its tokens
        self.stop_ids: list[int] = []

    def load(self) -> None:
        from tuiapp.core.after.targets import model_target
        from tuiapp.trainer.tools import inference

        target = model_target(self.run_dir, self.checkpoint)
        self.root = str(target.path)
        self.recipe = inference.frozen_recipe(self.run_dir)
        loaded = inference.load("tuned", target, self.recipe.model.trust_remote_code)
        self.context = context_length(loaded.model, loaded.tokenizer)
        self.token_bytes = max((len(t.encode()) for t in loaded.tokenizer.get_vocab()), default=1) or 1
        self.counter = copy.deepcopy(loaded.tokenizer)
        self.stop_ids = inference.stop_ids(loaded.model, loaded.tokenizer)
        self.loaded = loaded

    def bound(self, messages: list[dict], settings, asked: bool):
        """(settings, the prompt's token ids): prompt tokens + max_tokens within the model's context,
        or a 400 saying why, before any work waits on the model. A prompt whose bytes alone hold more
        tokens than the context is refused without tokenizing it (a 7 MB prompt in milliseconds), the
        rest by its exact token count. max_tokens not given (`asked` False) is cut to what the context
        leaves."""
        from tuiapp.trainer.tools import inference

        limit = self.context
        least = sum(len(m["content"].encode()) for m in messages) // self.token_bytes  # tokens, at least
        if least >= limit:
            raise ApiError(400, f"the messages hold at least {least:,} tokens; this model reads at most {limit:,} "
                           "(prompt and answer together)", code="context_length_exceeded", param="messages")
        with self.tokenizer_lock:
            tokenizer = self.counter
            text = inference.prompt_text(tokenizer, inference.conversation(messages, settings.system))
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        prompt = len(ids)
        room = limit - prompt
        if room < 1:
            raise ApiError(400, f"the messages are {prompt:,} tokens; this model reads at most {limit:,} "
                           "(prompt and answer together)", code="context_length_exceeded", param="messages")
        if settings.max_new_tokens > room:
            if asked:
                raise ApiError(400, f"max_tokens {settings.max_new_tokens:,} + the messages' {prompt:,} tokens is "
                               f"more than this model's context of {limit:,} tokens; ask for at most {room:,}",
                               code="context_length_exceeded", param="max_tokens")
            settings = settings.model_copy(update={"max_new_tokens": room})
        return settings, ids

    def authorized(self, header: str | None) -> bool:
        if not self.token:
            return True
        scheme, _, given = (header or "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), self.token.encode())

    def models(self) -> dict:
        return {"object": "list", "data": [{"id": self.model_id, "object": "model", "created": self.created,
                                            "owned_by": "llmtui", "root": self.root}]}

    def settings(self, body: dict):
        from tuiapp.core.config.recipe import GenerateSpec

        values = self.recipe.generate.model_dump()
        limit = body.get("max_completion_tokens", body.get("max_tokens"))
        for key, value in (("temperature", body.get("temperature")), ("top_p", body.get("top_p")),
                           ("max_new_tokens", limit)):
            if value is not None:
                values[key] = value
        try:
            return GenerateSpec(**values)
        except ValueError as exc:
            first = exc.errors()[0] if hasattr(exc, "errors") else {}
            param = {"max_new_tokens": "max_tokens"}.get(str((first.get("loc") or ["?"])[0]),
                                                          str((first.get("loc") or ["?"])[0]))
            raise ApiError(400, f"{param}: {first.get('msg', exc)}", param=param) from None

    def check(self, body: dict) -> tuple[list[dict], list[str]]:
        if body.get("model") != self.model_id:
            raise ApiError(404, f"The model '{body.get('model')}' does not exist; this server has '{self.model_id}'",
                           code="model_not_found", param="model")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError(400, "messages must be a non-empty array", param="messages")
        clean = []
        for message in messages:
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, list):  # content parts: the text ones, joined
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
            if not isinstance(message, dict) or not isinstance(content, str) or not message.get("role"):
                raise ApiError(400, "each message needs a role and a text content", param="messages")
            role = "system" if message["role"] == "developer" else message["role"]
            clean.append({"role": role, "content": content})
        if (body.get("n") or 1) != 1:
            raise ApiError(400, "only n=1 is supported", param="n")
        stop = body.get("stop")
        stops = [] if stop is None else [stop] if isinstance(stop, str) else stop
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops) or len(stops) > 4:
            raise ApiError(400, "stop must be a string or up to 4 strings", param="stop")
        stops = [s for s in stops if s]
        return clean, stops

    def generation_config(self, settings, stops: list[str]):
        """The run's generation settings as the engine's GenerationConfig (as `llmtui chat` answers)."""
        from tuiapp.trainer.tools import inference

        loaded = self.loaded
        config = copy.deepcopy(loaded.model.generation_config)
        config.update(**inference.settings_kwargs(settings))
        config.eos_token_id = self.stop_ids
        config.pad_token_id = loaded.tokenizer.pad_token_id
        config.stop_strings = stops or None  # the engine stops at them; the text is cut in RunChat
        return config

    def inputs(self, messages: list[dict], settings, ids: list[int]) -> dict:
        """The engine's model inputs: the prompt's ids (or a vision-language model's processor tensors)."""
        import torch

        from tuiapp.trainer.tools import inference

        loaded = self.loaded
        if loaded.processor is not None:
            with self.tokenizer_lock:
                enc = inference.vision_inputs(loaded.processor, inference.conversation(messages, settings.system), [])
        else:
            enc = {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long)}
        device = next(loaded.model.parameters()).device
        return {k: v.to(device) for k, v in enc.items()}


def context_length(model, tokenizer) -> int:
    """The tokens the model reads at most: its config's position limit, else the tokenizer's."""
    config = getattr(model, "config", None)
    config = getattr(config, "text_config", None) or config
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    value = getattr(tokenizer, "model_max_length", None)
    return value if isinstance(value, int) and 0 < value < 10**7 else DEFAULT_CONTEXT


# ---------------------------------------------------------------- transformers' server, with the run's model


def build_app(endpoint: Endpoint):
    """transformers' FastAPI app with the run's model, llmtui's routes and the guard in front."""
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, StreamingResponse
    from openai.types.completion_usage import CompletionUsage
    from starlette.exceptions import HTTPException
    from transformers.cli.serving import ModelManager, build_server
    from transformers.cli.serving.chat_completion import ChatCompletionHandler
    from transformers.cli.serving.utils import GenerationState, _StreamError

    class RunModels(ModelManager):
        """transformers' model manager holding one model, the run's, loaded by Endpoint.load."""

        def __init__(self):
            super().__init__(device="cpu", model_timeout=-1)
            self.force_model = endpoint.model_id

        def load_model_and_processor(self, model_id_and_revision, progress_callback=None, tqdm_class=None,
                                     gguf_file=None):
            if endpoint.loaded is None:
                raise ApiError(503, "the model is still loading; retry in a moment", code="model_loading")
            return endpoint.loaded.model, endpoint.loaded.tokenizer

        def shutdown(self) -> None:
            generation.shutdown()

    class RunChat(ChatCompletionHandler):
        """/v1/chat/completions: the run's prompt, settings and bounds, answered by the engine."""

        async def handle_request(self, body: dict, request_id: str):
            messages, stops = endpoint.check(body)
            asked = body.get("max_completion_tokens", body.get("max_tokens")) is not None
            settings, ids = endpoint.bound(messages, endpoint.settings(body), asked)
            model, tokenizer = self.model_manager.load_model_and_processor(endpoint.model_id)
            manager = self.generation_state.get_manager(endpoint.model_id, use_cb=False)
            inputs = endpoint.inputs(messages, settings, ids)
            config = endpoint.generation_config(settings, stops)
            ident = f"chatcmpl-{request_id}"
            if body.get("stream"):
                return self._stream(ident, manager, model, tokenizer, inputs, config, stops)
            text, prompt, new = await manager.generate_non_streaming(model, tokenizer, inputs, config, ident)
            cut = StopFilter(stops)
            content = (cut.feed(text) + cut.flush()).strip()
            usage = CompletionUsage(prompt_tokens=prompt, completion_tokens=len(new), total_tokens=prompt + len(new))
            return JSONResponse(self._build_completion(ident, content, endpoint.model_id,
                                                       _finish(cut.hit, new, config), usage=usage))

        def _stream(self, ident, manager, model, tokenizer, inputs, config, stops):
            queue, streamer = manager.generate_streaming(model, tokenizer, inputs, config, request_id=ident)
            prompt = int(inputs["input_ids"].shape[-1])

            async def events():
                cut, first = StopFilter(stops), True
                try:
                    yield self._build_chunk_sse(ident, role="assistant", content="", model=endpoint.model_id)
                    while (item := await queue.get()) is not None:
                        if isinstance(item, _StreamError):
                            yield f"data: {json.dumps({'error': {'message': item.msg, 'type': 'server_error'}})}\n\n"
                            return
                        text = cut.feed(str(item))
                        if first:  # the answer without its leading whitespace, as the non-streamed one
                            text = text.lstrip()
                            first = not text
                        if text:
                            yield self._build_chunk_sse(ident, content=text, model=endpoint.model_id)
                        if cut.hit:
                            streamer.cancel()
                    rest = cut.flush().lstrip() if first else cut.flush()
                    if rest:
                        yield self._build_chunk_sse(ident, content=rest, model=endpoint.model_id)
                    done = streamer.total_tokens
                    usage = CompletionUsage(prompt_tokens=prompt, completion_tokens=done, total_tokens=prompt + done)
                    finish = "stop" if cut.hit or done < config.max_new_tokens else "length"
                    yield self._build_chunk_sse(ident, finish_reason=finish, model=endpoint.model_id, usage=usage)
                    yield "data: [DONE]\n\n"
                except (GeneratorExit, asyncio.CancelledError):  # the client left: the generation ends too
                    streamer.cancel()
                    raise

            return StreamingResponse(events(), media_type="text/event-stream")

    def _finish(stopped: bool, new, config) -> str:
        ended = len(new) and int(new[-1]) in endpoint.stop_ids
        return "stop" if stopped or ended or len(new) < config.max_new_tokens else "length"

    generation = GenerationState(continuous_batching=False)
    models = RunModels()
    chat = RunChat(models, generation)
    app = build_server(models, chat, None, None, None, None, generation)
    # transformers' other routes are not this server's: /v1/models lists the hub cache, /health knows no
    # loading, /v1/completions takes no token ids nor prompt_logprobs, /load_model and /reset would load
    # any model or drop the run's; /v1/responses, /v1/systemone and audio have no handler here
    app.router.routes[:] = [r for r in app.router.routes if getattr(r, "path", None) == "/v1/chat/completions"]

    @app.exception_handler(ApiError)
    async def _api_error(_request, exc: ApiError):
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(UserError)
    async def _user_error(_request, exc: UserError):
        return JSONResponse(ApiError(400, str(exc), "context_length_exceeded", "messages").body(), status_code=400)

    @app.exception_handler(HTTPException)
    async def _http_error(request, exc: HTTPException):
        message = exc.detail if exc.status_code != 404 else f"no route {request.method} {request.url.path}"
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "invalid_request_error")
        return JSONResponse(ApiError(exc.status_code, str(message), code).body(), status_code=exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request, exc: RequestValidationError):
        return JSONResponse(ApiError(400, f"the body is not valid: {exc.errors()[:1]}").body(), status_code=400)

    @app.exception_handler(Exception)
    async def _failed(_request, exc: Exception):  # a failure inside generation: the client hears it
        return JSONResponse(ApiError(500, f"{type(exc).__name__}: {exc}", code="server_error").body(),
                            status_code=500)

    # llmtui's routes, as plain Starlette routes (FastAPI would read their annotations)
    async def health(_request):
        ready = endpoint.loaded is not None
        return JSONResponse({"status": "ok" if ready else "loading", "model": endpoint.model_id},
                            status_code=200 if ready else 503)

    async def list_models(_request):
        return JSONResponse(endpoint.models())

    async def one_model(request):
        if request.path_params["model_id"] != endpoint.model_id:
            raise ApiError(404, f"The model '{request.path_params['model_id']}' does not exist",
                           code="model_not_found", param="model")
        return JSONResponse(endpoint.models()["data"][0])

    async def text_completions(request):
        from tuiapp.trainer.tools import completions

        asked = completions.read_request(json.loads(await request.body()), endpoint, ApiError)
        manager = generation.get_manager(endpoint.model_id, use_cb=False)  # the chat's inference thread
        return JSONResponse(await manager.async_submit(completions.complete, endpoint, asked))

    app.add_route("/health", health, methods=["GET"])
    app.add_route("/v1/models", list_models, methods=["GET"])
    app.add_route("/v1/models/{model_id:path}", one_model, methods=["GET"])
    app.add_route("/v1/completions", text_completions, methods=["POST"])
    return Guard(app, endpoint)


def _json_message(status: int, data: dict) -> tuple[dict, dict]:
    payload = json.dumps(data, ensure_ascii=False).encode()
    return ({"type": "http.response.start", "status": status,
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]},
            {"type": "http.response.body", "body": payload})


class Guard:
    """ASGI middleware in front of transformers' app: the token, loading, the body bound by the bytes
    read, JSON that parses, admission (MAX_WAITING), and one log line per request."""

    def __init__(self, app, endpoint: Endpoint):
        self.app, self.endpoint = app, endpoint
        self.waiting = 0  # requests in the server (one event loop: no lock)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started, status = time.monotonic(), [0]

        async def sending(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self._guarded(scope, receive, sending)
        finally:
            if scope["path"] != "/health":
                client = scope.get("client") or ("-", 0)
                sys.stderr.write(f"{time.strftime('%H:%M:%S')} {client[0]} \"{scope['method']} {scope['path']}\" "
                                 f"{status[0] or '-'} {time.monotonic() - started:.2f}s\n")

    async def _refuse(self, send, error: ApiError) -> None:
        for message in _json_message(error.status, error.body()):
            await send(message)

    async def _guarded(self, scope, receive, send) -> None:
        endpoint, path = self.endpoint, scope["path"]
        if not path.startswith("/v1"):
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        auth = headers.get(b"authorization")
        if not endpoint.authorized(auth.decode("latin-1") if auth is not None else None):
            await self._refuse(send, ApiError(401, "Incorrect API key provided", code="invalid_api_key"))
            return
        if endpoint.loaded is None:
            await self._refuse(send, ApiError(503, "the model is still loading; retry in a moment",
                                              code="model_loading"))
            return
        if scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        try:
            body = await self._body(receive)
            data = json.loads(body or b"{}")
        except ApiError as exc:
            await self._refuse(send, exc)
            return
        except ValueError as exc:
            await self._refuse(send, ApiError(400, f"the body is not JSON: {exc}"))
            return
        if not isinstance(data, dict):
            await self._refuse(send, ApiError(400, "the body must be a JSON object"))
            return
        if self.waiting >= MAX_WAITING:
            await self._refuse(send, ApiError(503, f"{MAX_WAITING} requests are waiting for the model; retry in a "
                                              "moment", code="server_busy"))
            return
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        self.waiting += 1
        try:
            await self.app(scope, replay, send)
        finally:
            self.waiting -= 1

    @staticmethod
    async def _body(receive) -> bytes:
        """The body, bounded by the bytes read, whatever a header says."""
        parts, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ApiError(400, f"the body ended after {size:,} bytes: the client closed the connection")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > MAX_BODY:
                raise ApiError(413, f"the body is more than {MAX_BODY:,} bytes", param="body")
            parts.append(chunk)
            if not message.get("more_body"):
                return b"".join(parts)


def http_protocol():
    """uvicorn's h11 protocol, saying why a request is malformed: its 400 names h11's reason (`bad
    Content-Length` for a negative or non-numeric one), and a client that half-closes before the
    body its Content-Length announced is answered 400 (`received N bytes, expected M`) instead of
    being dropped. The body is never read past what arrived, nor past the cap (Guard)."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class Reasons:
        def __init__(self, conn, protocol):
            self._conn, self._protocol = conn, protocol

        def __getattr__(self, name):
            return getattr(self._conn, name)

        def next_event(self):
            try:
                return self._conn.next_event()
            except h11.RemoteProtocolError as exc:
                self._protocol.reason = str(exc)
                raise

    class Protocol(H11Protocol):
        reason = ""

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self.conn = Reasons(self.conn, self)

        def send_400_response(self, msg: str) -> None:
            super().send_400_response(f"{msg} {self.reason}" if self.reason else msg)

        def eof_received(self):
            if self.cycle is not None and not self.cycle.response_complete and self.conn.their_state is h11.SEND_BODY:
                self.conn.receive_data(b"")  # the body ended early: h11 says so, handle_events answers 400
                self.handle_events()
                return True
            return None

    return Protocol


def _listen(host: str, port: int) -> socket.socket:
    """The port taken before the model loads (a second server on it fails at once)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock


def main(argv=None) -> int:
    from pathlib import Path

    parser = argparse.ArgumentParser(prog=trainer_tools.prog("openai_server"))
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="localhost")
    parser.add_argument("--model-id", default=None, help="the model's name for clients (default: the run id)")
    parser.add_argument("--checkpoint", type=int, default=None)
    args = parser.parse_args(argv)
    token = os.environ.pop(TOKEN_ENV, None) or None  # not inherited by anything this process starts
    endpoint = Endpoint(args.run_dir, args.checkpoint, args.model_id or args.run_dir.name, token)
    try:
        sock = _listen(args.host, args.port)
    except OSError as exc:
        print(f"error: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}", file=sys.stderr, flush=True)
        return 2
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):  # SIGTERM/SIGINT end the server; the process then exits 0
            self.should_exit = True

    server = Server(uvicorn.Config(build_app(endpoint), log_level="warning", access_log=False, http=http_protocol(),
                                   ws="none", lifespan="on", backlog=BACKLOG, limit_concurrency=2 * MAX_WAITING,
                                   timeout_graceful_shutdown=GRACE_S))
    print(f"listening on {args.host}:{args.port}; loading the model of {args.run_dir.name}...", flush=True)

    def load() -> None:
        try:
            endpoint.load()
        except Exception as exc:
            message = str(exc) if isinstance(exc, UserError) else f"{type(exc).__name__}: {exc}"
            print(f"error: the model could not be loaded: {message}", file=sys.stderr, flush=True)
            os._exit(2)
        print(f"serving {endpoint.model_id} ({endpoint.loaded.label}, loaded in {endpoint.loaded.load_s:.1f}s) on "
              f"http://{args.host}:{args.port}/v1" + (" (token required)" if token else ""), flush=True)

    threading.Thread(target=load, name="load", daemon=True).start()
    server.run(sockets=[sock])
    print("stopped", flush=True)
    sys.stderr.flush()
    os._exit(0)  # nothing to save: skip the interpreter's slow teardown of torch


if __name__ == "__main__":
    sys.exit(main())
