"""What `llmtui serve` checks and adds to a request before transformers' engine answers it, with no
web framework: the run's model (Endpoint.load, as `llmtui chat` loads it), the prompt bound, the
fields, the run's generation settings, `stop` strings cut out of text, OpenAI's error shapes.
openai_server and serve_app use it."""

from __future__ import annotations

import copy
import hmac
import threading
import time
from pathlib import Path

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
        self.adapter: str | None = None  # its adapter's name in a model shared with other runs (Models)

    def load(self) -> None:
        from tuiapp.core.after.targets import model_target
        from tuiapp.trainer.tools import inference

        target = model_target(self.run_dir, self.checkpoint)
        self.recipe = inference.frozen_recipe(self.run_dir)
        self.ready(target, inference.load("tuned", target, self.recipe.model.trust_remote_code))

    def ready(self, target, loaded) -> None:
        """The run's loaded model (its own, or the base it shares with other runs' adapters)."""
        from tuiapp.trainer.tools import inference

        self.root = str(Path(target.path).resolve())  # absolute: a client elsewhere compares it with its own folders
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

    def activate(self) -> None:
        """Its adapter made the shared model's active one. peft's active adapter is global to the
        model: call only on the thread every generation runs on (the engine's inference thread),
        right before generating, so no other run's request comes between."""
        if self.adapter is not None:
            self.loaded.model.set_adapter(self.adapter)

    def authorized(self, header: str | None) -> bool:
        if not self.token:
            return True
        scheme, _, given = (header or "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), self.token.encode())

    def card(self) -> dict:
        return {"id": self.model_id, "object": "model", "created": self.created, "owned_by": "llmtui",
                "root": self.root}

    def models(self) -> dict:
        return {"object": "list", "data": [self.card()]}

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

    def check_batched(self, body: dict) -> None:
        """With continuous batching (transformers 5.23) every request in the batch is sampled with the
        settings the batch was started with, the run's [generate] table: a request asking for another
        temperature (or top_p, when it samples) is refused, never answered with the wrong one."""
        fixed = self.recipe.generate
        for key, value, mine in (("temperature", body.get("temperature"), fixed.temperature),
                                 ("top_p", body.get("top_p"), fixed.top_p)):
            if key == "top_p" and fixed.temperature == 0:
                continue  # greedy: top_p plays no part, as on the server without batching
            if value is not None and not (isinstance(value, (int, float)) and float(value) == float(mine)):
                raise ApiError(400, f"{key} {value} differs from this server's {mine} (the run's [generate] "
                               f"{key}): with --continuous-batching every request is answered with the settings the "
                               f"batch started with; omit {key}, or restart the server without "
                               "--continuous-batching to choose it per request", param=key)

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


class Models:
    """The runs one server answers for: one run's model, or several runs' adapters on their one
    base, loaded once (a PeftModel holding each run's adapter under its own name, a0, a1, ...), each
    run's tokenizer, chat template, [generate] defaults and context its own. A request's `model`
    picks the run (Endpoint); an unknown one is a 404 naming those served."""

    def __init__(self, endpoints: list[Endpoint]):
        self.endpoints = {e.model_id: e for e in endpoints}
        self.first = endpoints[0]
        self.token = self.first.token
        self.prepare = None  # called once the models are loaded, before they answer (serve_app's batching)
        self.loaded = None  # the first run's Loaded, once every run's model is ready (the guard's "loading")

    def authorized(self, header: str | None) -> bool:
        return self.first.authorized(header)

    @property
    def ids(self) -> list[str]:
        return list(self.endpoints)

    def get(self, model_id) -> Endpoint:
        endpoint = self.endpoints.get(model_id) if isinstance(model_id, str) else None
        if endpoint is None:
            names = ", ".join(f"'{i}'" for i in self.endpoints)
            raise ApiError(404, f"The model '{model_id}' does not exist; this server has {names}",
                           code="model_not_found", param="model")
        return endpoint

    def models(self) -> dict:
        return {"object": "list", "data": [e.card() for e in self.endpoints.values()]}

    def load(self) -> None:
        if len(self.endpoints) == 1:
            self.first.load()
            if self.prepare is not None:
                self.prepare()
            self.loaded = self.first.loaded
            return
        from tuiapp.core.after.targets import model_target
        from tuiapp.trainer.tools import inference

        endpoints = list(self.endpoints.values())
        targets = [model_target(e.run_dir, e.checkpoint) for e in endpoints]
        for endpoint in endpoints:
            endpoint.recipe = inference.frozen_recipe(endpoint.run_dir)
        names = [f"a{i}" for i in range(len(endpoints))]
        shared = inference.load_adapters(targets, names, self.first.recipe.model.trust_remote_code)
        for endpoint, target, loaded, name in zip(endpoints, targets, shared, names, strict=True):
            endpoint.adapter = name
            endpoint.ready(target, loaded)
        self.loaded = self.first.loaded

    @property
    def label(self) -> str:
        if self.loaded is None or len(self.endpoints) == 1:
            return self.loaded.label if self.loaded else ""
        return "adapters on one base: " + ", ".join(f"{e.model_id} {e.loaded.label}" for e in self.endpoints.values())


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
