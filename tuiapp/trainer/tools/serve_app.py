"""transformers' OpenAI-compatible server (transformers.cli.serving) with a run's model, for
`llmtui serve` (openai_server puts its guard in front and runs it on uvicorn).

transformers' app answers `POST /v1/chat/completions` through RunChat, its chat handler with the
run's prompt, settings and bounds, and every generation runs on its engine (GenerationState: one
inference thread for the model, requests queued to it). RunModels is its model manager holding one
model, the run's, loaded by openai_server.Endpoint as `llmtui chat` loads it. The other routes are
llmtui's: /v1/completions with prompt_logprobs, /v1/models, /health."""

from __future__ import annotations

import asyncio
import json
import os

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from openai.types.completion_usage import CompletionUsage
from starlette.exceptions import HTTPException
from transformers.cli.serving import ModelManager, build_server
from transformers.cli.serving.chat_completion import ChatCompletionHandler
from transformers.cli.serving.utils import GenerationState, _StreamError

from tuiapp.core.common.errors import UserError
from tuiapp.trainer.tools.serve_requests import ApiError, Endpoint, Models, StopFilter


class RunModels(ModelManager):
    """transformers' model manager holding the runs' model (never unloaded): one run's, or one base
    with several runs' adapters (serve_requests.Models)."""

    def __init__(self, models: Models, generation: GenerationState):
        super().__init__(device="cpu", model_timeout=-1)
        self.models, self.generation = models, generation
        self.force_model = models.first.model_id

    def load_model_and_processor(self, model_id_and_revision, progress_callback=None, tqdm_class=None,
                                 gguf_file=None):
        if self.models.loaded is None:
            raise ApiError(503, "the model is still loading; retry in a moment", code="model_loading")
        endpoint = self.models.get(model_id_and_revision)
        return endpoint.loaded.model, endpoint.loaded.tokenizer

    def shutdown(self) -> None:
        self.generation.shutdown()


ENGINE = "llmtui"  # the one manager (inference thread) every run's generations queue to


class _Active:
    """The shared model as the engine sees it for one run's request: generate() makes the run's
    adapter the active one first. The engine calls it on its one inference thread, so the adapter
    switch and the generation happen together, never between another run's."""

    def __init__(self, endpoint: Endpoint):
        self.endpoint = endpoint

    def generate(self, **kwargs):
        self.endpoint.activate()
        return self.endpoint.loaded.model.generate(**kwargs)


def engine_model(endpoint: Endpoint):
    return endpoint.loaded.model if endpoint.adapter is None else _Active(endpoint)


class RunChat(ChatCompletionHandler):
    """/v1/chat/completions: the run's prompt, settings and bounds, answered by the engine."""

    def __init__(self, manager: RunModels, generation: GenerationState, models: Models, batching: bool = False):
        super().__init__(manager, generation)
        self.models, self.batching = models, batching

    async def handle_request(self, body: dict, request_id: str):
        endpoint = self.models.get(body.get("model"))
        messages, stops = endpoint.check(body)
        if self.batching:
            endpoint.check_batched(body)
        asked = body.get("max_completion_tokens", body.get("max_tokens")) is not None
        settings, ids = endpoint.bound(messages, endpoint.settings(body), asked)
        _, tokenizer = self.model_manager.load_model_and_processor(endpoint.model_id)
        model = engine_model(endpoint)
        manager = self.generation_state.get_manager(ENGINE, use_cb=self.batching)
        config = endpoint.generation_config(settings, stops)
        if self.batching:  # the batch's own settings; the request brings its prompt, max_tokens and stops
            inputs = {"input_ids": list(ids)}
            config.stop_strings = None  # not the engine's: cut from the text here
        else:
            inputs = endpoint.inputs(messages, settings, ids)
        ident = f"chatcmpl-{request_id}"
        if body.get("stream"):
            return self._stream(ident, endpoint, manager, (model, tokenizer), inputs, config, stops)
        if self.batching and stops:  # streamed inside, so the request leaves the batch at its stop string
            text, new = await self._until_stop(ident, manager, (model, tokenizer), inputs, config, stops)
            prompt = len(ids)
        else:
            text, prompt, new = await manager.generate_non_streaming(model, tokenizer, inputs, config, ident)
        cut = StopFilter(stops)
        content = (cut.feed(text) + cut.flush()).strip()
        ended = len(new) and new[-1] is not None and int(new[-1]) in endpoint.stop_ids
        finish = "stop" if cut.hit or ended or len(new) < config.max_new_tokens else "length"
        usage = CompletionUsage(prompt_tokens=prompt, completion_tokens=len(new), total_tokens=prompt + len(new))
        return JSONResponse(self._build_completion(ident, content, endpoint.model_id, finish, usage=usage))

    @staticmethod
    async def _until_stop(ident, manager, pair, inputs, config, stops) -> tuple[str, list]:
        """A batched request's text up to its first stop string (the request cancelled there); the
        generated tokens counted (their ids are not kept: a list of that length)."""
        queue, streamer = manager.generate_streaming(*pair, inputs, config, request_id=ident)
        pieces = []
        try:
            while (item := await queue.get()) is not None:
                if isinstance(item, _StreamError):
                    raise RuntimeError(item.msg)
                pieces.append(str(item))
                if any(stop in "".join(pieces) for stop in stops):
                    streamer.cancel()
                    break
        except asyncio.CancelledError:
            streamer.cancel()
            raise
        return "".join(pieces), [None] * streamer.total_tokens

    def _stream(self, ident, endpoint, manager, pair, inputs, config, stops) -> StreamingResponse:
        """Server-sent chat.completion.chunk events, the stop strings cut, then [DONE]."""
        queue, streamer = manager.generate_streaming(*pair, inputs, config, request_id=ident)
        ids = inputs["input_ids"]
        prompt, name = (len(ids) if isinstance(ids, list) else int(ids.shape[-1])), endpoint.model_id

        async def events():
            cut, first = StopFilter(stops), True
            try:
                yield self._build_chunk_sse(ident, role="assistant", content="", model=name)
                while (item := await queue.get()) is not None:
                    if isinstance(item, _StreamError):
                        yield f"data: {json.dumps({'error': {'message': item.msg, 'type': 'server_error'}})}\n\n"
                        return
                    text = cut.feed(str(item))
                    if first:  # the answer without its leading whitespace, as the non-streamed one
                        text = text.lstrip()
                        first = not text
                    if text:
                        yield self._build_chunk_sse(ident, content=text, model=name)
                    if cut.hit:  # the rest is not the client's: the generation ends here
                        streamer.cancel()
                        break
                rest = cut.flush().lstrip() if first else cut.flush()
                if rest:
                    yield self._build_chunk_sse(ident, content=rest, model=name)
                done = streamer.total_tokens
                usage = CompletionUsage(prompt_tokens=prompt, completion_tokens=done, total_tokens=prompt + done)
                finish = "stop" if cut.hit or done < config.max_new_tokens else "length"
                yield self._build_chunk_sse(ident, finish_reason=finish, model=name, usage=usage)
                yield "data: [DONE]\n\n"
            except (GeneratorExit, asyncio.CancelledError):  # the client left: the generation ends too
                streamer.cancel()
                raise

        return StreamingResponse(events(), media_type="text/event-stream")


def _errors(app) -> None:
    """Every refusal in OpenAI's error shape."""

    @app.exception_handler(ApiError)
    async def _api_error(_request, exc):
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(UserError)
    async def _user_error(_request, exc):
        return JSONResponse(ApiError(400, str(exc), "context_length_exceeded", "messages").body(), status_code=400)

    @app.exception_handler(HTTPException)
    async def _http_error(request, exc):
        message = exc.detail if exc.status_code != 404 else f"no route {request.method} {request.url.path}"
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "invalid_request_error")
        return JSONResponse(ApiError(exc.status_code, str(message), code).body(), status_code=exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request, exc):
        return JSONResponse(ApiError(400, f"the body is not valid: {exc.errors()[:1]}").body(), status_code=400)

    @app.exception_handler(Exception)
    async def _failed(_request, exc):  # a failure inside generation: the client hears it, the server goes on
        return JSONResponse(ApiError(500, f"{type(exc).__name__}: {exc}", code="server_error").body(),
                            status_code=500)


def _routes(app, models: Models, generation: GenerationState, batching: bool = False) -> None:
    """llmtui's routes, as plain Starlette routes (FastAPI would read their annotations)."""

    async def health(_request):
        ready = models.loaded is not None
        return JSONResponse({"status": "ok" if ready else "loading", "model": models.first.model_id,
                             "models": models.ids}, status_code=200 if ready else 503)

    async def list_models(_request):
        return JSONResponse(models.models())

    async def one_model(request):
        return JSONResponse(models.get(request.path_params["model_id"]).card())

    async def text_completions(request):
        from tuiapp.trainer.tools import completions

        body = json.loads(await request.body())
        endpoint = models.get(body.get("model"))
        if batching:
            raise ApiError(400, "/v1/completions is not answered with --continuous-batching: its prompt_logprobs and "
                           "per-request sampling run outside the batch, on the model the batch is using; use "
                           "/v1/chat/completions, or restart the server without --continuous-batching",
                           code="unsupported_with_batching")
        asked = completions.read_request(body, endpoint, ApiError)
        manager = generation.get_manager(ENGINE, use_cb=False)  # the chat's inference thread

        def complete():
            endpoint.activate()  # on the inference thread, as the chat's generations
            return completions.complete(endpoint, asked)

        return JSONResponse(await manager.async_submit(complete))

    app.add_route("/health", health, methods=["GET"])
    app.add_route("/v1/models", list_models, methods=["GET"])
    app.add_route("/v1/models/{model_id:path}", one_model, methods=["GET"])
    app.add_route("/v1/completions", text_completions, methods=["POST"])


BATCH_TOKENS = int(os.environ.get("LLMTUI_SERVE_BATCH_TOKENS", "512"))  # tokens one forward pass of the batch holds
CACHE_TOKENS = int(os.environ.get("LLMTUI_SERVE_CACHE_TOKENS", "32768"))  # tokens the batch's paged KV cache holds


def batching_config():
    """transformers' ContinuousBatchingConfig with a bounded cache. Left to itself on CPU, transformers 5.23
    sizes the paged cache from the machine's free memory: on the tiny model it zeroed GBs and took 31 s
    before its first answer; CACHE_TOKENS of cache held the same 8 requests in 640 MB of RSS."""
    from transformers import ContinuousBatchingConfig

    page = 256
    return ContinuousBatchingConfig(page_size=page, num_blocks=max(1, -(-CACHE_TOKENS // page)),
                                    max_batch_tokens=BATCH_TOKENS)


def start_batching(models: Models, generation: GenerationState) -> None:
    """The batch started on the loaded model with the run's [generate] settings (fixed for every
    request: transformers 5.23's CBGenerateManager takes them once), or UserError saying why it cannot."""
    endpoint = models.first
    loaded, spec = endpoint.loaded, endpoint.recipe.generate
    if loaded.processor is not None:
        raise UserError(message=f"{endpoint.model_id} is a vision-language model: transformers' continuous batching "
                                "takes text prompts only", fix="serve it without --continuous-batching")
    if spec.repetition_penalty != 1.0:
        raise UserError(message=f"the run's [generate] repetition_penalty is {spec.repetition_penalty}: transformers' "
                                "continuous batching drops it", fix="serve it without --continuous-batching")
    if not hasattr(loaded.model, "init_continuous_batching"):
        raise UserError(message=f"{type(loaded.model).__name__} has no continuous batching in transformers",
                        fix="serve it without --continuous-batching")
    config = endpoint.generation_config(endpoint.settings({}), [])
    config.stop_strings = None
    manager = generation.get_manager(ENGINE, use_cb=True)
    manager.init_cb(loaded.model, config)


def build_app(models: Models, batching: bool = False):
    """transformers' FastAPI app with the runs' model and llmtui's routes; with `batching`, the chat
    answered by transformers' continuous batching (one run, its [generate] settings for every request)."""
    generation = GenerationState(continuous_batching=batching, cb_config=batching_config() if batching else None)
    manager = RunModels(models, generation)
    if batching:
        models.prepare = lambda: start_batching(models, generation)
    app = build_server(manager, RunChat(manager, generation, models, batching), None, None, None, None, generation)
    # transformers' other routes are not this server's: /v1/models lists the hub cache, /health knows no
    # loading, /v1/completions takes no token ids nor prompt_logprobs, /load_model and /reset would load
    # any model or drop the run's; /v1/responses, /v1/systemone and audio have no handler here
    app.router.routes[:] = [r for r in app.router.routes if getattr(r, "path", None) == "/v1/chat/completions"]
    _errors(app)
    _routes(app, models, generation, batching)
    return app
