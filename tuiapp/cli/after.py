"""`llmtui chat | eval | export-metrics`: after training. Each resolves the run through tuiapp.core
(targets, chat, evals) and leaves torch to a child process: the inference server
(tuiapp.trainer.serve), the evaluation tool (tuiapp.trainer.evaluate), the TensorBoard writer
(tuiapp.trainer.tb_export). `--json` prints exactly one JSON document on stdout, errors too."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from pathlib import Path

from tuiapp.cli.shared import print_err
from tuiapp.core import evals
from tuiapp.core.chat import ChatSession, check_overrides
from tuiapp.core.datasets import FORMATS, load_records, resolve_source
from tuiapp.core.errors import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK, DatasetError, RunError, UserError
from tuiapp.core.jsonout import error_document, stdout_to_stderr, write_document
from tuiapp.core.recipe import DatasetSpec
from tuiapp.core.runs import RunStore
from tuiapp.core.targets import model_target

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
    with stdout_to_stderr() as out:
        try:
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
                document = {"run": session.run_dir.name, "target": session.target.as_dict(),
                            "settings": {**session.settings, **session.overrides}, "prompt": args.prompt,
                            "answers": answers}
        except UserError as exc:
            print_err(str(exc))
            write_document(out, error_document(exc))
            return EXIT_BAD_INPUT
        write_document(out, document)
    return EXIT_OK


# ---------------------------------------------------------------- eval


def parse_columns(text: str) -> dict[str, str]:
    """--columns prompt=question,response=answer (the recipe's dataset.columns)."""
    columns = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        role, sep, column = item.partition("=")
        if not sep or not role.strip() or not column.strip():
            raise UserError(message=f"--columns: '{item}' is not ROLE=COLUMN", fix="e.g. --columns prompt=question,"
                            "response=answer")
        columns[role.strip()] = column.strip()
    return columns


def _check_data(name: str, fmt: str, columns: dict[str, str]) -> int:
    """The records the evaluation will read (the same reader as training); errors name --data."""
    spec = DatasetSpec(name=name, format=fmt, columns=columns)
    try:
        if resolve_source(spec, Path.cwd()).kind == "hub":
            raise DatasetError(message=f"'{name}' looks like a hub dataset; eval reads local files and demos",
                               key="--data", fix="save the split as .jsonl (datasets: ds.to_json('eval.jsonl')) "
                               "and pass that file")
        return len(load_records(spec, Path.cwd()))
    except DatasetError as exc:
        fix = (exc.fix or "").replace("set dataset.columns", "pass --columns").replace("{prompt='question', "
                                                                                      "response='answer'}",
                                                                                      "prompt=question,response=answer")
        raise DatasetError(message=exc.message, file=exc.file, line=exc.line,
                           key=(exc.key or "").replace("dataset.format", "--format").replace("dataset.", "--") or None,
                           fix=fix or None) from None


def _run_tool(argv: list[str]) -> tuple[int, list[str]]:
    """Run a torch-side tool with all its output on stderr (stdout stays ours); its exit code and
    the error lines it printed."""
    proc = subprocess.Popen([sys.executable, "-m", *argv], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace")
    errors: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        sys.stderr.write(line)
        sys.stderr.flush()
        if line.startswith("error: ") or (errors and line.startswith("  fix: ")):
            errors.append(line.rstrip("\n"))
    return proc.wait(), errors


def _evaluate(args) -> dict:
    run = RunStore(args.runs_dir).get(args.run)
    target = model_target(run.path, args.checkpoint, purpose="be evaluated")
    columns = parse_columns(args.columns)
    count = _check_data(args.data, args.format, columns)
    if args.tasks and importlib.util.find_spec("lm_eval") is None:
        raise UserError(message="--tasks needs lm-evaluation-harness, which is not installed",
                        fix="pip install lm-eval (offline, each task's dataset must also be in the local "
                        "datasets cache), or leave out --tasks")
    out = evals.new_path(run.path)
    argv = ["tuiapp.trainer.evaluate", str(run.path), "--data", args.data, "--format", args.format,
            "--out", str(out), "--limit", str(args.limit), "--gen-limit", str(args.gen_limit),
            "--columns", args.columns]
    if args.checkpoint is not None:
        argv += ["--checkpoint", str(args.checkpoint)]
    if args.no_base:
        argv.append("--no-base")
    if args.tasks:
        argv += ["--tasks", args.tasks]
    print(f"evaluating {target.label} of {run.id} on {args.data} ({count} records)...", file=sys.stderr, flush=True)
    code, errors = _run_tool(argv)
    result = evals.read(out) if code == 0 else None
    if result is None:
        message = errors[0][len("error: "):] if errors else f"the evaluation failed (exit {code})"
        fix = errors[1].strip()[len("fix: "):] if len(errors) > 1 else "see the output above"
        raise RunError(message=message, fix=fix)
    return {**result, "path": str(out)}


def cmd_eval(args) -> int:
    if not args.json:
        result = _evaluate(args)
        print("\n".join(evals.table(result)))
        print(f"saved {result['path']}")
        return EXIT_OK
    with stdout_to_stderr() as out:
        try:
            result = _evaluate(args)
        except UserError as exc:
            print_err(str(exc))
            write_document(out, error_document(exc))
            return EXIT_BAD_INPUT
        write_document(out, result)
    return EXIT_OK


# ---------------------------------------------------------------- export-metrics


def cmd_export_metrics(args) -> int:
    run = RunStore(args.runs_dir).get(args.run)
    if not run.metrics_path.is_file():
        raise RunError(message=f"{run.id} has no metrics.jsonl yet", fix="export a run that has trained a step")
    if importlib.util.find_spec("tensorboard") is None:
        raise UserError(message="--tensorboard needs the tensorboard package, which is not installed",
                        fix="pip install 'llmtui[tensorboard]'")
    code, errors = _run_tool(["tuiapp.trainer.tb_export", str(run.path), "--out", str(args.tensorboard)])
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
