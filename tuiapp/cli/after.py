"""`llmtui chat | eval | export-metrics`: after training. Each resolves the run through tuiapp.core
(targets, chat, evaluation, evals) and leaves torch to a child process: the inference server
(tuiapp.trainer.serve), the evaluation tool (tuiapp.trainer.evaluate), the TensorBoard writer
(tuiapp.trainer.tb_export). `--json` prints exactly one JSON document on stdout, errors too."""

from __future__ import annotations

import importlib.util
import sys
import time

from tuiapp.cli.shared import json_document, print_err
from tuiapp.core import evals, evaluation
from tuiapp.core.chat import ChatSession, check_overrides
from tuiapp.core.child_tool import ChildTool
from tuiapp.core.datasets import FORMATS
from tuiapp.core.errors import EXIT_FAILED, EXIT_OK, RunError, UserError
from tuiapp.core.runs import RunStore

EXIT_COMMANDS = ("/quit", "/exit")


def _models(args) -> list[str]:
    if args.vs_base:
        return ["tuned", "base"]
    return ["base"] if args.base else ["tuned"]


# ---------------------------------------------------------------- chat


def _settings(args) -> dict:
    return check_overrides({"system": args.system, "temperature": args.temperature, "top_p": args.top_p,
                            "max_new_tokens": args.max_new_tokens})


def _open_session(args) -> ChatSession:
    run = RunStore(args.runs_dir).get(args.run)
    session = ChatSession(run.path, args.checkpoint, load=_models(args))  # errors before any process
    session.overrides = _settings(args)
    return session


def _label(session: ChatSession, model: str) -> str:
    return f"{session.target.label} of {session.run_dir.name}" if model == "tuned" else f"base {session.target.base}"


def _stream_answer(session: ChatSession, text: str, model: str, heading: bool) -> dict:
    if heading:
        print(f"[{model}: {_label(session, model)}]", flush=True)

    def show(event: dict) -> None:
        if event.get("event") == "token":
            print(event.get("text", ""), end="", flush=True)

    done = session.ask(text, model, on_event=show)
    print(flush=True)
    if done.get("event") == "error":
        print_err(str(done.get("message")))
    return done


def cmd_chat(args) -> int:
    if args.json:
        return _chat_json(args)
    session = _open_session(args)
    models = _models(args)
    print(f"loading {', '.join(_label(session, m) for m in models)}...", file=sys.stderr, flush=True)
    with session:
        started = time.perf_counter()
        session.start()
        print(f"ready in {time.perf_counter() - started:.1f}s", file=sys.stderr, flush=True)
        if args.prompt is not None:
            failed = [m for m in models if _stream_answer(session, args.prompt, m, len(models) > 1).get("event") != "done"]
            return EXIT_FAILED if failed else EXIT_OK
        interactive = sys.stdin.isatty()
        if interactive:
            print("type a message; /reset forgets the conversation, /quit (or Ctrl-D) ends", file=sys.stderr)
        while True:
            try:
                text = input("you> " if interactive else "")
            except EOFError:
                return EXIT_OK
            text = text.strip()
            if not text:
                continue
            if text in EXIT_COMMANDS:
                return EXIT_OK
            if text == "/reset":
                session.reset()
                print("(conversation forgotten)", file=sys.stderr)
                continue
            for model in models:
                _stream_answer(session, text, model, len(models) > 1)


def _chat_json(args) -> int:
    return json_document(lambda: _chat_document(args))


def _chat_document(args) -> dict:
    if args.prompt is None:
        raise UserError(message="--json needs --prompt TEXT (one answer, one document)",
                        fix='llmtui chat RUN --prompt "..." --json')
    session = _open_session(args)
    with session:
        session.start()
        answers = {}
        for model in _models(args):
            done = session.ask(args.prompt, model)
            if done.get("event") != "done":
                raise RunError(message=f"the {model} model failed to answer: {done.get('message')}",
                               fix=f"see {session.log_path}")
            answers[model] = {k: done.get(k) for k in ("text", "tokens", "seconds")}
        return {"run": session.run_dir.name, "target": session.target.as_dict(),
                "settings": {**session.settings, **session.overrides}, "prompt": args.prompt, "answers": answers}


# ---------------------------------------------------------------- eval


def _run_tool(argv: list[str]) -> tuple[int, list[str]]:
    """Run a torch-side tool with all its output on stderr (stdout stays ours); its exit code and
    the error lines it printed."""
    outcome = ChildTool(argv[0], argv[1:]).run(_echo)
    return outcome.code, outcome.errors


def _echo(line: str) -> None:
    sys.stderr.write(line)
    sys.stderr.flush()


def _evaluate(args) -> dict:
    run = RunStore(args.runs_dir).get(args.run)
    request = evaluation.EvalRequest(data=args.data, format=args.format, columns=args.columns,
                                     checkpoint=args.checkpoint, no_base=args.no_base, limit=args.limit,
                                     gen_limit=args.gen_limit, tasks=args.tasks)
    planned = evaluation.plan(run.path, request)  # every check, before any work
    print(planned.summary, file=sys.stderr, flush=True)
    return evaluation.run(planned, _echo)


def cmd_eval(args) -> int:
    if not args.json:
        result = _evaluate(args)
        print("\n".join(evals.table(result)))
        print(f"saved {result['path']}")
        return EXIT_OK
    return json_document(lambda: _evaluate(args))


# ---------------------------------------------------------------- export-metrics


def cmd_export_metrics(args) -> int:
    run = RunStore(args.runs_dir).get(args.run)
    if not run.metrics_path.is_file():
        raise RunError(message=f"{run.id} has no metrics.jsonl yet", fix="export a run that has trained a step")
    if importlib.util.find_spec("tensorboard") is None:
        raise UserError(message="--tensorboard needs the tensorboard package, which is not installed",
                        fix="pip install 'llmtui[tensorboard]'")
    code, _errors = _run_tool(["tuiapp.trainer.tb_export", str(run.path), "--out", str(args.tensorboard)])
    return EXIT_OK if code == 0 else EXIT_FAILED


# ---------------------------------------------------------------- parser


def add_commands(add) -> None:
    p = add("chat", cmd_chat, "talk to a run's model (final or a checkpoint), or its base, or both")
    p.add_argument("run")
    p.add_argument("--checkpoint", type=int, default=None, metavar="N", help="checkpoint-N instead of final/")
    who = p.add_mutually_exclusive_group()
    who.add_argument("--base", action="store_true", help="the base model the run started from")
    who.add_argument("--vs-base", action="store_true", help="the tuned model and its base, one after the other")
    p.add_argument("--prompt", default=None, metavar="TEXT", help="answer once and exit")
    p.add_argument("--json", action="store_true", help="with --prompt: one JSON document")
    p.add_argument("--system", default=None, help="system prompt (default: the run's generate.system)")
    p.add_argument("--temperature", type=float, default=None, help="0 = greedy (default: generate.temperature)")
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--max-new-tokens", type=int, default=None)

    p = add("eval", cmd_eval, "loss, perplexity and answer scores of a run's model vs its base on held-out data")
    p.add_argument("run")
    p.add_argument("--data", required=True, help="a local file (.json .jsonl .csv .parquet .txt), a folder, or "
                   "a demo (demo:facts-heldout)")
    p.add_argument("--format", default="auto", choices=("auto", *FORMATS))
    p.add_argument("--columns", default="", metavar="ROLE=COL,...", help="column names, as the recipe's "
                   "dataset.columns: prompt=question,response=answer")
    p.add_argument("--checkpoint", type=int, default=None, metavar="N")
    p.add_argument("--no-base", action="store_true", help="only the tuned model")
    p.add_argument("--limit", type=int, default=0, help="first N records only (0 = all)")
    p.add_argument("--gen-limit", type=int, default=50, help="prompt→response records answered for exact match "
                   "and ROUGE-L (0 = none)")
    p.add_argument("--tasks", default="", help="lm-evaluation-harness tasks, comma-separated (package and data "
                   "must be here)")
    p.add_argument("--json", action="store_true")

    p = add("export-metrics", cmd_export_metrics, "write a run's metrics as TensorBoard event files")
    p.add_argument("run")
    p.add_argument("--tensorboard", required=True, metavar="DIR", help="log dir; the run goes to DIR/<run id>/")
