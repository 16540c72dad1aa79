"""The inference server: a run's model, warm, answering over JSON lines.

    python -m tuiapp.trainer.tools.serve RUN_DIR [--checkpoint N] [--load tuned,base]

Started by `llmtui chat` and the TUI's chat screen (through tuiapp.core.after.chat), so neither ever
imports torch. One request per line on stdin, events on stdout, one JSON object per line,
flushed as they happen; library output goes to stderr (fd 1 is pointed there).

requests:
  {"op": "generate", "id": 1, "model": "tuned"|"base", "messages": [{"role", "content"}...],
   "settings": {"temperature": 0.7, ...}}        settings override the run's [generate] table; a turn's
                                                  "images": [paths] go to a vision-language model
  {"op": "load", "model": "base"}                 load a model now rather than at its first use
  {"op": "quit"}                                  (end of input does the same)
events:
  {"event": "loading", "model"}, {"event": "loaded", "model", "label", "load_s"}
  {"event": "ready", "target", "settings", "models", "images"}  once, after the --load models (images:
                                                                 whether the loaded models see images)
  {"event": "token", "id", "model", "text"}                     streamed pieces of an answer
  {"event": "done", "id", "model", "text", "tokens", "seconds"}
  {"event": "error", "id", "message"}                            a bad request; the server goes on
  {"event": "fatal", "message"}                                  it cannot start; it exits 2
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from tuiapp.core.common import trainer_tools

MODELS = ("tuned", "base")


class Server:
    def __init__(self, out, target, recipe):
        self.out = out
        self.target = target
        self.recipe = recipe
        self.loaded: dict = {}

    def emit(self, event: dict) -> None:
        self.out.write(json.dumps(event, ensure_ascii=False) + "\n")
        self.out.flush()

    def model(self, name: str):
        from tuiapp.trainer.tools import inference

        if name not in MODELS:
            raise ValueError(f"unknown model '{name}' (use one of: {', '.join(MODELS)})")
        if name not in self.loaded:
            self.emit({"event": "loading", "model": name})
            loaded = inference.load(name, self.target, self.recipe.model.trust_remote_code)
            self.loaded[name] = loaded
            self.emit({"event": "loaded", "model": name, "label": loaded.label, "load_s": round(loaded.load_s, 3)})
        return self.loaded[name]

    def settings(self, overrides: dict | None):
        from tuiapp.core.config.recipe import GenerateSpec

        values = self.recipe.generate.model_dump()
        values.update({k: v for k, v in (overrides or {}).items() if v is not None})
        return GenerateSpec(**values)

    def handle(self, request: dict) -> bool:
        """Answer one request; False when the server should end."""
        from tuiapp.trainer.tools import inference

        op = request.get("op", "generate")
        ident = request.get("id")
        if op == "quit":
            return False
        if op == "load":
            self.model(str(request.get("model") or "tuned"))
            return True
        if op != "generate":
            raise ValueError(f"unknown op '{op}' (generate, load or quit)")
        messages = request.get("messages")
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and isinstance(m.get("content"), str) and m.get("role") for m in messages):
            raise ValueError("messages must be a non-empty list of {role, content}")
        name = str(request.get("model") or "tuned")
        loaded = self.model(name)
        settings = self.settings(request.get("settings"))

        def on_text(text: str) -> None:
            self.emit({"event": "token", "id": ident, "model": name, "text": text})

        result = inference.generate(loaded, messages, settings, on_text)
        self.emit({"event": "done", "id": ident, "model": name, **result})
        return True

    def serve(self, lines) -> None:
        for line in lines:
            line = line.strip()
            if not line:
                continue
            request: dict = {}
            try:
                request = json.loads(line)
                if not isinstance(request, dict):
                    raise ValueError("a request is one JSON object per line")
                if not self.handle(request):
                    return
            except Exception as exc:  # a bad request, or one that failed: say so and go on
                ident = request.get("id") if isinstance(request, dict) else None
                from tuiapp.core.common.errors import UserError

                said = str(exc) if isinstance(exc, UserError) else f"{type(exc).__name__}: {exc}"
                self.emit({"event": "error", "id": ident, "message": said})


def _protocol_stdout():
    """The real stdout for events; fd 1 (and sys.stdout) now write to stderr."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    return os.fdopen(saved, "w", encoding="utf-8", buffering=1)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog=trainer_tools.prog("serve"))
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--checkpoint", type=int, default=None)
    parser.add_argument("--load", default="tuned", help="models to load before ready: tuned, base, or both")
    args = parser.parse_args(argv)
    out = _protocol_stdout()
    server = None
    try:
        from tuiapp.core.after.targets import model_target
        from tuiapp.core.common.errors import UserError
        from tuiapp.trainer.tools.inference import frozen_recipe

        target = model_target(args.run_dir, args.checkpoint)
        server = Server(out, target, frozen_recipe(args.run_dir))
        for name in [n for n in args.load.split(",") if n]:
            server.model(name)
    except UserError as exc:
        Server(out, None, None).emit({"event": "fatal", "message": str(exc)})
        return 2
    except Exception as exc:
        Server(out, None, None).emit({"event": "fatal", "message": f"{type(exc).__name__}: {exc}"})
        return 2
    server.emit({"event": "ready", "target": target.as_dict(), "settings": server.recipe.generate.model_dump(),
                 "models": {n: loaded.label for n, loaded in server.loaded.items()},
                 "images": {n: loaded.processor is not None for n, loaded in server.loaded.items()}})
    server.serve(sys.stdin)
    return 0


if __name__ == "__main__":
    sys.exit(main())
