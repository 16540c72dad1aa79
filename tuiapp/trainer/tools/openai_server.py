"""An OpenAI-compatible chat endpoint for a run's model (`llmtui serve`, transformers backend).

    python -m tuiapp.trainer.tools.openai_server RUN_DIR --port P [--host H] [--model-id ID] [--checkpoint N]

The model loads and answers exactly as `llmtui chat` does (tuiapp.trainer.tools.inference: the full model
or the adapter on its base, the chat template it trained with, the run's [generate] table as
defaults), warm for every request. Requests are answered one at a time (one model, one lock).

    GET  /v1/models             the one model, named by --model-id (the run id); `root`: its folder
    POST /v1/chat/completions   {model, messages, stream?, temperature?, top_p?, max_tokens?,
                                 max_completion_tokens?, stop?, frequency_penalty? (ignored)}
                                 stream: server-sent events, chat.completion.chunk, then [DONE]
    POST /v1/completions        a raw prompt (text or token ids), and vLLM's prompt_logprobs (completions.py)
    GET  /health                {"status": "loading" | "ok"}: 503 while the model loads

With $LLMTUI_SERVE_TOKEN set, every /v1 request needs `Authorization: Bearer TOKEN` (401 otherwise).
The port is taken before the model loads, so a second server on it fails at once; SIGTERM ends
the server (an answer being streamed is cut).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import hmac
import json
import os
import signal
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tuiapp.core.common import trainer_tools
from tuiapp.core.common.errors import UserError

TOKEN_ENV = "LLMTUI_SERVE_TOKEN"  # tuiapp.core.store.served.TOKEN_ENV
MAX_BODY = 8 * 1024 * 1024
BACKLOG = 1024  # connections the kernel queues before accept (http.server's default, 5, reset them under load)
MAX_WAITING = int(os.environ.get("LLMTUI_SERVE_MAX_WAITING", "512"))  # requests waiting for the model; more: 503
DEFAULT_CONTEXT = 2048  # a model whose config names no context length


class ApiError(Exception):
    def __init__(self, status: int, message: str, code: str = "invalid_request_error", param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param

    def body(self) -> dict:
        kind = "authentication_error" if self.status == 401 else "invalid_request_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


class ClientGone(Exception):
    """The client closed the connection while its answer streamed."""


class StopReached(Exception):
    """A stop string appeared in the answer: generation ends there."""


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
    """The model behind the HTTP handler: loaded once, one answer at a time."""

    def __init__(self, run_dir: Path, checkpoint: int | None, model_id: str, token: str | None):
        self.run_dir, self.checkpoint, self.model_id, self.token = run_dir, checkpoint, model_id, token
        self.root = None  # the model's folder, as vLLM's /v1/models names it
        self.loaded = None
        self.recipe = None
        self.created = int(time.time())
        self.lock = threading.Lock()
        self.tokenizer_lock = threading.Lock()  # a fast tokenizer refuses concurrent use ("Already borrowed")
        self.counter = None
        self.waiting = 0  # requests in the handler threads, waiting for or holding the model
        self.waiting_lock = threading.Lock()
        self.context = DEFAULT_CONTEXT
        self.token_bytes = 1  # the longest token's UTF-8 bytes: prompt bytes / it ≤ its tokens

    def load(self) -> None:
        from tuiapp.core.after.targets import model_target
        from tuiapp.trainer.tools import inference

        target = model_target(self.run_dir, self.checkpoint)
        self.root = str(target.path)
        self.recipe = inference.frozen_recipe(self.run_dir)
        loaded = inference.load("tuned", target, self.recipe.model.trust_remote_code)
        self.context = context_length(loaded.model, loaded.tokenizer)
        self.token_bytes = max((len(t.encode()) for t in loaded.tokenizer.get_vocab()), default=1) or 1
        self.counter = copy.deepcopy(loaded.tokenizer)  # counts prompts beside the one generating
        self.loaded = loaded

    def bound(self, messages: list[dict], settings, asked: bool):
        """Prompt tokens + max_tokens within the model's context, or a 400 saying why, before any work
        waits on the model: a prompt whose bytes alone hold more tokens than the context is refused
        without tokenizing it (a 7 MB prompt in milliseconds), the rest by its exact token count.
        max_tokens not given (`asked` False) is cut to what the context leaves."""
        from tuiapp.trainer.tools import inference

        limit = self.context
        least = sum(len(m["content"].encode()) for m in messages) // self.token_bytes  # tokens, at least
        if least >= limit:
            raise ApiError(400, f"the messages hold at least {least:,} tokens; this model reads at most {limit:,} "
                           "(prompt and answer together)", code="context_length_exceeded", param="messages")
        with self.tokenizer_lock:
            tokenizer = self.counter
            text = inference.prompt_text(tokenizer, inference.conversation(messages, settings.system))
            prompt = len(tokenizer(text, add_special_tokens=False)["input_ids"])
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
        return settings

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

    def answer(self, messages: list[dict], settings, stops: list[str], on_text=None) -> dict:
        from tuiapp.trainer.tools import inference

        cut = StopFilter(stops)

        def piece(text: str) -> None:
            out = cut.feed(text)
            if out and on_text:
                on_text(out)
            if cut.hit:
                raise StopReached

        with self.lock:
            try:
                result = inference.generate(self.loaded, messages, settings, piece)
            except StopReached:
                result = None
        rest = cut.flush()
        if rest and on_text:
            on_text(rest)
        if result is None:  # cut at a stop string: the text is what streamed
            return {"finish_reason": "stop", "stopped": True}
        return result


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


class Server(ThreadingHTTPServer):
    allow_reuse_address = True
    daemon_threads = True
    request_queue_size = BACKLOG


def _chunk(ident: str, created: int, model: str, delta: dict, finish: str | None) -> bytes:
    data = {"id": ident, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


class ApiHandler(BaseHTTPRequestHandler):
    """The OpenAI-compatible routes over one Endpoint (make_handler binds it)."""

    endpoint: Endpoint
    protocol_version = "HTTP/1.1"
    server_version = "llmtui"

    def log_message(self, fmt, *args):  # one line per request in serve.log (no token; not the health polls)
        if self.path == "/health":
            return
        sys.stderr.write(f"{time.strftime('%H:%M:%S')} {self.address_string()} {fmt % args}\n")

    def _json(self, status: int, data: dict) -> None:
        payload = json.dumps(data, ensure_ascii=False).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _guard(self) -> None:
        if not self.endpoint.authorized(self.headers.get("Authorization")):
            raise ApiError(401, "Incorrect API key provided", code="invalid_api_key")
        if self.endpoint.loaded is None:
            raise ApiError(503, "the model is still loading; retry in a moment", code="model_loading")

    def do_GET(self):
        try:
            if self.path == "/health":
                ready = self.endpoint.loaded is not None
                self._json(200 if ready else 503, {"status": "ok" if ready else "loading",
                                                   "model": self.endpoint.model_id})
                return
            self._guard()
            if self.path.rstrip("/") == "/v1/models":
                self._json(200, self.endpoint.models())
            elif self.path == f"/v1/models/{self.endpoint.model_id}":
                self._json(200, self.endpoint.models()["data"][0])
            else:
                raise ApiError(404, f"no route GET {self.path}", code="not_found")
        except ApiError as exc:
            self._json(exc.status, exc.body())
        except (BrokenPipeError, ConnectionResetError):  # the client left before the answer
            self.close_connection = True

    def do_POST(self):
        try:
            route = self.path.rstrip("/")
            self._guard()
            if route == "/v1/completions":
                self._completion(self._json_body())
                return
            if route != "/v1/chat/completions":
                raise ApiError(404, f"no route POST {self.path}", code="not_found")
            self._admitted(self._json_body())
        except ApiError as exc:
            self.close_connection = True  # the rest of a refused body is never read
            self._json(exc.status, exc.body())
        except UserError as exc:  # the request's to fix (a conversation longer than the model reads): a 400
            self._json(400, ApiError(400, str(exc), "context_length_exceeded", "messages").body())
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as exc:  # a failure inside generation: the client hears it, the server goes on
            sys.stderr.write(f"error: {type(exc).__name__}: {exc}\n")
            self._json(500, {"error": {"message": f"{type(exc).__name__}: {exc}", "type": "server_error",
                                       "param": None, "code": None}})

    def _json_body(self) -> dict:
        try:
            body = json.loads(self._body() or b"{}")
        except ValueError:
            raise ApiError(400, "the body is not JSON") from None
        if not isinstance(body, dict):
            raise ApiError(400, "the body must be a JSON object")
        return body

    def _completion(self, body: dict) -> None:
        from tuiapp.trainer.tools import completions

        request = completions.read_request(body, self.endpoint, ApiError)
        with self._waiting():
            with self.endpoint.lock:
                answer = completions.complete(self.endpoint, request)
        self._json(200, answer)

    def _admitted(self, body: dict) -> None:
        """The request checked and bounded, then answered if fewer than MAX_WAITING wait for the model."""
        endpoint = self.endpoint
        messages, stops = endpoint.check(body)
        asked = body.get("max_completion_tokens", body.get("max_tokens")) is not None
        settings = endpoint.bound(messages, endpoint.settings(body), asked)
        with self._waiting():
            self._answer(body, messages, settings, stops)

    @contextlib.contextmanager
    def _waiting(self):
        """One more request waiting for the model, or a 503 when MAX_WAITING already are."""
        endpoint = self.endpoint
        with endpoint.waiting_lock:
            full = endpoint.waiting >= MAX_WAITING
            if not full:
                endpoint.waiting += 1
        if full:
            raise ApiError(503, f"{MAX_WAITING} requests are waiting for the model; retry in a moment",
                           code="server_busy")
        try:
            yield
        finally:
            with endpoint.waiting_lock:
                endpoint.waiting -= 1

    def _body(self) -> bytes:
        """The body, bounded by the bytes read, not by what the header claims."""
        header = self.headers.get("Content-Length")
        if self.headers.get("Transfer-Encoding"):
            raise ApiError(400, "send the body with a Content-Length, not chunked", param="Content-Length")
        if header is None:
            raise ApiError(411, "a Content-Length header is required", param="Content-Length")
        try:
            length = int(header.strip())
        except ValueError:
            raise ApiError(400, f"Content-Length '{header[:40]}' is not a number", param="Content-Length") from None
        if length < 0:
            raise ApiError(400, f"Content-Length {length} is negative", param="Content-Length")
        if length > MAX_BODY:
            raise ApiError(413, f"the body is {length:,} bytes; at most {MAX_BODY:,}", param="Content-Length")
        data = self.rfile.read(length)
        if len(data) != length:
            raise ApiError(400, f"the body ended after {len(data):,} of the {length:,} bytes its Content-Length "
                           "announced", param="Content-Length")
        return data

    def _answer(self, body, messages, settings, stops) -> None:
        if body.get("stream"):
            self._stream(messages, settings, stops, bool((body.get("stream_options") or {})
                                                         .get("include_usage")))
            return
        result = self.endpoint.answer(messages, settings, stops) if not stops else self._collect(
            messages, settings, stops)
        usage = {"prompt_tokens": result.get("prompt_tokens", 0), "completion_tokens": result.get("tokens", 0)}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        self._json(200, {
            "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": self.endpoint.model_id,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": result["text"]},
                         "finish_reason": result.get("finish_reason", "stop"), "logprobs": None}],
            "usage": usage})

    def _collect(self, messages, settings, stops) -> dict:
        parts: list[str] = []
        result = self.endpoint.answer(messages, settings, stops, parts.append)
        return {**result, "text": "".join(parts).strip()} if result.get("stopped") else result

    def _stream(self, messages, settings, stops, usage: bool) -> None:
        ident, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")  # the body ends when the connection does
        self.end_headers()
        self.close_connection = True

        def send(data: bytes) -> None:
            try:
                self.wfile.write(data)
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                raise ClientGone from None

        send(_chunk(ident, created, self.endpoint.model_id, {"role": "assistant", "content": ""}, None))
        first = [True]

        def on_text(text: str) -> None:
            if first[0]:  # the answer without its leading whitespace, as the non-streamed one
                text = text.lstrip()
                first[0] = not text
            if text:
                send(_chunk(ident, created, self.endpoint.model_id, {"content": text}, None))

        try:
            result = self.endpoint.answer(messages, settings, stops, on_text)
            send(_chunk(ident, created, self.endpoint.model_id, {}, result.get("finish_reason", "stop")))
            if usage:
                prompt, done = result.get("prompt_tokens", 0), result.get("tokens", 0)
                data = {"id": ident, "object": "chat.completion.chunk", "created": created,
                        "model": self.endpoint.model_id, "choices": [],
                        "usage": {"prompt_tokens": prompt, "completion_tokens": done,
                                  "total_tokens": prompt + done}}
                send(f"data: {json.dumps(data)}\n\n".encode())
            send(b"data: [DONE]\n\n")
        except ClientGone:
            sys.stderr.write("the client closed the stream; the answer was cut\n")


def make_handler(endpoint: Endpoint) -> type[ApiHandler]:
    """A handler class bound to this endpoint (http.server builds one handler per request)."""
    return type("Handler", (ApiHandler,), {"endpoint": endpoint})


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog=trainer_tools.prog("openai_server"))
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="localhost")
    parser.add_argument("--model-id", default=None, help="the model's name for clients (default: the run id)")
    parser.add_argument("--checkpoint", type=int, default=None)
    args = parser.parse_args(argv)
    token = os.environ.pop(TOKEN_ENV, None) or None  # not inherited by anything this process starts
    endpoint = Endpoint(args.run_dir, args.checkpoint, args.model_id or args.run_dir.name, token)
    if ":" in args.host:
        import socket

        Server.address_family = socket.AF_INET6
    try:
        httpd = Server((args.host, args.port), make_handler(endpoint))
    except OSError as exc:
        print(f"error: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}", file=sys.stderr, flush=True)
        return 2

    def on_term(signum, frame):
        if endpoint.loaded is None:  # still loading: nothing to finish
            raise SystemExit(0)
        threading.Thread(target=httpd.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    serving = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
    serving.start()
    print(f"listening on {args.host}:{args.port}; loading the model of {args.run_dir.name}...", flush=True)
    try:
        endpoint.load()
    except Exception as exc:
        from tuiapp.core.common.errors import UserError

        message = str(exc) if isinstance(exc, UserError) else f"{type(exc).__name__}: {exc}"
        print(f"error: the model could not be loaded: {message}", file=sys.stderr, flush=True)
        httpd.shutdown()
        return 2
    print(f"serving {endpoint.model_id} ({endpoint.loaded.label}, loaded in {endpoint.loaded.load_s:.1f}s) on "
          f"http://{args.host}:{args.port}/v1" + (" (token required)" if token else ""), flush=True)
    serving.join()
    httpd.server_close()
    print("stopped", flush=True)
    sys.stderr.flush()
    os._exit(0)  # nothing to save: skip the interpreter's slow teardown of torch


if __name__ == "__main__":
    sys.exit(main())
