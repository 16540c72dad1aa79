"""An OpenAI-compatible endpoint for a run's model (`llmtui serve`, transformers backend), on
transformers' own server (transformers.cli.serving: FastAPI + uvicorn, its generation engine).

    python -m tuiapp.trainer.tools.openai_server RUN_DIR [RUN_DIR...] --port P [--host H] [--model-id ID]
                                                [--checkpoint N]

transformers' app answers `POST /v1/chat/completions` through its handler classes and runs every
generation on its engine (GenerationState: one inference thread per model, requests queued to it).
What llmtui adds sits around that app:

- several runs' peft adapters of one base (RUN_DIR...): the base loaded once with each run's adapter
  on it (serve_requests.Models, inference.load_adapters), each run a model of /v1/models named by its
  run id, a request's `model` picking it (an unknown one: 404 naming those served). peft's active
  adapter is global to the model, so every run's generations go to one engine thread (serve_app.ENGINE)
  and each switches to its adapter there, right before it generates: never two at once, never mixed;
- the run -> model (serve_app): RunModels, transformers' ModelManager holding one model, the run's,
  loaded exactly as `llmtui chat` loads it (serve_requests.Endpoint, tuiapp.trainer.tools.inference:
  the full model or the adapter on its base); RunChat, transformers' chat handler, prompts it through
  the chat template it trained with and answers with the run's [generate] table as defaults;
- the guard (Guard, here: an ASGI middleware in front of the app): the API key ($LLMTUI_SERVE_TOKEN, a Bearer
  token on every /v1 request, 401 otherwise), 503 while the model loads, the body bounded by the
  bytes read (8 MB: 413 past it), JSON that does not parse a 400, more than MAX_WAITING requests in
  the server a 503, one line per request in serve.log (no token, no health polls);
- the prompt bound (prompt tokens + max_tokens within the model's context, a 400 saying why),
  `stop` strings cut out of the answer, OpenAI's error shapes (serve_requests);
- `POST /v1/completions` with vLLM's prompt_logprobs (completions.py; transformers' own route takes
  text prompts only and gives no logprobs), `GET /v1/models` (the one model, named by --model-id,
  the run id), `GET /health` ({"status": "loading" | "ok"}: 503 while the model loads).

The port is taken before the model loads, so a second server on it fails at once; SIGTERM ends the
server (an answer being streamed is cut after a short grace).

Continuous batching (--continuous-batching: transformers' CBGenerateManager, paged attention, every
request in one batch that admits new ones between decoding steps) is honest about what transformers
5.23 does. Its manager starts the batch once with one GenerationConfig (init_cb) and hands each later
request only max_new_tokens and eos_token_id, so sampling cannot differ per request (its per_request_processors reach temperature, top_p and top_k
only when the batch was started sampling with each of them set, and greedy or sampled stays the
batch's do_sample, so a greedy request after sampled ones would still be sampled): the batch starts
with the run's [generate] settings (serve_app.start_batching, once the model is loaded), and a request
asking for another temperature (or top_p, when sampling) is answered 400 naming the parameter and the
fix (restart without --continuous-batching). It has no stop strings: llmtui cuts them from the text
and cancels the request at the first one. Refused at start: several runs (one batch, one active
adapter), a vision-language model (text prompts only), a run whose repetition_penalty is not 1 (the
batch's logits processors drop it). /v1/completions is refused on such a server (400): it would run
outside the batch, on the model the batch is using. The paged cache is bounded (serve_app.batching_config):
left to itself on CPU, transformers sizes it from the machine's free memory.
Without the flag, each request gets its own settings, one generation at a time on the engine's
inference thread (GenerateManager), so no lock of ours is needed.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import threading
import time

from tuiapp.core.common import trainer_tools
from tuiapp.core.common.errors import UserError
from tuiapp.trainer.tools.serve_requests import ApiError, Endpoint, Models, StopFilter  # noqa: F401 (StopFilter: the server's)

TOKEN_ENV = "LLMTUI_SERVE_TOKEN"  # tuiapp.core.store.served.TOKEN_ENV
MAX_BODY = 8 * 1024 * 1024
BACKLOG = 2048  # connections the kernel queues before accept
MAX_WAITING = int(os.environ.get("LLMTUI_SERVE_MAX_WAITING", "512"))  # requests in the server; more: 503
GRACE_S = 3  # SIGTERM: how long answers being given may go on


def _json_message(status: int, data: dict) -> tuple[dict, dict]:
    payload = json.dumps(data, ensure_ascii=False).encode()
    return ({"type": "http.response.start", "status": status,
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]},
            {"type": "http.response.body", "body": payload})


class Guard:
    """ASGI middleware in front of transformers' app: the token, loading, the body bound by the bytes
    read, JSON that parses, admission (MAX_WAITING), and one log line per request."""

    def __init__(self, app, endpoint: Endpoint | Models):
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
    parser.add_argument("run_dirs", type=Path, nargs="+", help="one run, or several runs' adapters on one base")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="localhost")
    parser.add_argument("--model-id", default=None, help="one run's name for clients (default: the run id)")
    parser.add_argument("--checkpoint", type=int, default=None)
    parser.add_argument("--continuous-batching", action="store_true",
                        help="one batch for every request, with the run's [generate] settings (one run)")
    args = parser.parse_args(argv)
    if len(args.run_dirs) > 1 and (args.model_id or args.checkpoint is not None or args.continuous_batching):
        parser.error("--model-id, --checkpoint and --continuous-batching are for one run (several are named by their "
                     "run ids, and one batch cannot hold two adapters)")
    token = os.environ.pop(TOKEN_ENV, None) or None  # not inherited by anything this process starts
    models = Models([Endpoint(d, args.checkpoint, args.model_id or d.name, token) for d in args.run_dirs])
    names = ", ".join(d.name for d in args.run_dirs)
    try:
        sock = _listen(args.host, args.port)
    except OSError as exc:
        print(f"error: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}", file=sys.stderr, flush=True)
        return 2
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):  # SIGTERM/SIGINT end the server; the process then exits 0
            self.should_exit = True

    from tuiapp.trainer.tools.serve_app import build_app

    server = Server(uvicorn.Config(Guard(build_app(models, args.continuous_batching), models), log_level="warning", access_log=False, http=http_protocol(),
                                   ws="none", lifespan="on", backlog=BACKLOG, limit_concurrency=2 * MAX_WAITING,
                                   timeout_graceful_shutdown=GRACE_S))
    print(f"listening on {args.host}:{args.port}; loading the model of {names}...", flush=True)

    def load() -> None:
        try:
            models.load()
        except Exception as exc:
            message = str(exc) if isinstance(exc, UserError) else f"{type(exc).__name__}: {exc}"
            print(f"error: the model could not be loaded: {message}", file=sys.stderr, flush=True)
            os._exit(2)
        print(f"serving {', '.join(models.ids)} ({models.label}, loaded in {models.loaded.load_s:.1f}s) on "
              f"http://{args.host}:{args.port}/v1" + (" (token required)" if token else ""), flush=True)

    threading.Thread(target=load, name="load", daemon=True).start()
    server.run(sockets=[sock])
    print("stopped", flush=True)
    sys.stderr.flush()
    os._exit(0)  # nothing to save: skip the interpreter's slow teardown of torch


if __name__ == "__main__":
    sys.exit(main())
