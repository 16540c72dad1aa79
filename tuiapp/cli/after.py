"""`llmtui chat | eval | export-metrics`: after training. Each resolves the run through tuiapp.core
(targets, chat, evaluation, evals) and leaves torch to a child process: the inference server
(tuiapp.trainer.tools.serve), the evaluation tool (tuiapp.trainer.tools.evaluate), the TensorBoard writer
(the tb_export trainer tool). `--json` prints exactly one JSON document on stdout, errors too."""

from __future__ import annotations

import importlib.util
import sys
import time

from tuiapp.cli import judge, numbers
from tuiapp.cli.shared import json_document, print_err, saved_result
from tuiapp.core.after import benchmarking, evaluation
from tuiapp.core.after.chat import ChatSession, check_image, check_overrides, image_label
from tuiapp.core.common.child_tool import ChildTool
from tuiapp.core.common.errors import EXIT_FAILED, EXIT_OK, RunError, UserError
from tuiapp.core.data.datasets import FORMATS
from tuiapp.core.run_folder import benchmarks, evals
from tuiapp.core.store.runs import RunStore

EXIT_COMMANDS = ("/quit", "/exit")
IMAGE_COMMAND = "/image"


def _models(args) -> list[str]:
    """The server's models the first run's session loads (--vs adds a second run's session)."""
    if args.vs_base:
        return ["tuned", "base"]
    return ["base"] if args.base else ["tuned"]


class Arena:
    """Who answers each message: (heading, session, the server's model name), in order. With --vs
    a second run's server answers beside, with the first run's settings (so both answer alike)."""

    def __init__(self, args):
        self.main = _open_session(args)
        self.other: ChatSession | None = None
        if args.vs:
            vs = RunStore(args.runs_dir).get(args.vs)
            self.other = ChatSession(vs.path, None, load=["tuned"])  # errors before any process
        self.sides: list[tuple[str, ChatSession, str]] = [(m, self.main, m) for m in _models(args)]
        if self.other is not None:
            self.sides.append(("vs", self.other, "tuned"))
        for session in self.sessions:
            session.single_turn = bool(args.single_turn)

    @property
    def sessions(self) -> list[ChatSession]:
        return [self.main] + ([self.other] if self.other is not None else [])

    @staticmethod
    def label(key: str, session: ChatSession, model: str) -> str:
        return _label(session, model)

    def start(self) -> None:
        for session in self.sessions:
            session.start()
        if self.other is not None:
            self.other.overrides = self.main.answering_settings()

    def close(self) -> None:
        for session in self.sessions:
            session.close()


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


def _images(args) -> list[str]:
    """--image paths, checked (they exist and decode) before any process starts."""
    return [check_image(path) for path in (getattr(args, "image", None) or [])]


def _stream_answer(session: ChatSession, text: str, model: str, heading: str, images: list[str] | None = None) -> dict:
    if heading:
        print(f"[{heading}]", flush=True)

    def show(event: dict) -> None:
        if event.get("event") == "token":
            print(event.get("text", ""), end="", flush=True)

    done = session.ask(text, model, on_event=show, images=images)
    print(flush=True)
    if done.get("event") == "error":
        print_err(str(done.get("message")))
    return done


def cmd_chat(args) -> int:
    if args.json:
        return _chat_json(args)
    attached = _images(args)  # the next message's images (--image, then /image PATH)
    arena = Arena(args)
    sides = arena.sides
    headings = {key: (f"{key}: {arena.label(key, session, model)}" if len(sides) > 1 else "")
                for key, session, model in sides}

    def answer(text: str) -> list[str]:
        """Every side's answer to the message (with the attached images); the sides that failed."""
        images = list(attached)
        attached.clear()
        return [key for key, session, model in sides
                if _stream_answer(session, text, model, headings[key], images).get("event") != "done"]

    print(f"loading {', '.join(arena.label(*side) for side in sides)}...", file=sys.stderr, flush=True)
    try:
        started = time.perf_counter()
        arena.start()
        print(f"ready in {time.perf_counter() - started:.1f}s", file=sys.stderr, flush=True)
        if args.prompt is not None:
            return EXIT_FAILED if answer(args.prompt) else EXIT_OK
        interactive = sys.stdin.isatty()
        if interactive:
            print("type a message; /image PATH attaches an image to the next one, /reset forgets the "
                  "conversation, /quit (or Ctrl-D) ends"
                  + (" (single turn: each message is answered alone)" if args.single_turn else ""), file=sys.stderr)
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
                for session in arena.sessions:
                    session.reset()
                print("(conversation forgotten)", file=sys.stderr)
                continue
            if text == IMAGE_COMMAND or text.startswith(IMAGE_COMMAND + " "):
                try:
                    attached.append(check_image(text[len(IMAGE_COMMAND):]))
                except UserError as exc:
                    print_err(str(exc) + (f" ({exc.fix})" if exc.fix else ""))
                    continue
                print(f"(attached {image_label(attached[-1])} to the next message)", file=sys.stderr)
                continue
            answer(text)
    finally:
        arena.close()


def _chat_json(args) -> int:
    return json_document(lambda: _chat_document(args))


def _chat_document(args) -> dict:
    if args.prompt is None:
        raise UserError(message="--json needs --prompt TEXT (one answer, one document)",
                        fix='llmtui chat RUN --prompt "..." --json')
    images = _images(args)
    arena = Arena(args)
    try:
        arena.start()
        answers = {}
        for key, session, model in arena.sides:
            done = session.ask(args.prompt, model, images=images)
            if done.get("event") != "done":
                raise RunError(message=f"the {key} model failed to answer: {done.get('message')}",
                               fix=f"see {session.log_path}")
            answers[key] = {k: done.get(k) for k in ("text", "tokens", "seconds")}
        main = arena.main
        document = {"run": main.run_dir.name, "target": main.target.as_dict(),
                    "settings": {**main.settings, **main.overrides}, "prompt": args.prompt, "answers": answers}
        if images:
            document["images"] = images
        if arena.other is not None:
            document["vs"] = {"run": arena.other.run_dir.name, "target": arena.other.target.as_dict()}
        return document
    finally:
        arena.close()


# ---------------------------------------------------------------- eval


def _run_tool(argv: list[str]) -> tuple[int, list[str]]:
    """Run a torch-side tool (argv[0]: its name in trainer_tools.TOOLS) with all its output on stderr
    (stdout stays ours); its exit code and the error lines it printed."""
    outcome = ChildTool(argv[0], argv[1:]).run(_echo)
    return outcome.code, outcome.errors


def _echo(line: str) -> None:
    sys.stderr.write(line)
    sys.stderr.flush()


def _evaluate(args) -> dict:
    run = RunStore(args.runs_dir).get(args.run)
    data = args.data if args.data is not None else evaluation.default_data(run.path)
    if not data:
        raise evaluation.no_default_data(run.path)
    request = evaluation.EvalRequest(data=data, format=args.format, columns=args.columns,
                                     checkpoint=args.checkpoint, no_base=args.no_base, limit=args.limit,
                                     gen_limit=args.gen_limit, tasks=args.tasks)
    planned = evaluation.plan(run.path, request)  # every check, before any work
    print(planned.summary, file=sys.stderr, flush=True)
    return evaluation.run(planned, _echo)


def _benchmark(args) -> dict:
    run = RunStore(args.runs_dir).get(args.run)
    request = benchmarking.BenchRequest(tasks=list(args.benchmark), checkpoints=args.checkpoints,
                                        checkpoint=args.checkpoint, no_base=args.no_base, limit=args.limit,
                                        num_fewshot=args.num_fewshot, chat_template=args.chat_template)
    planned = benchmarking.plan(run.path, request)  # every check, before any work
    print(planned.summary, file=sys.stderr, flush=True)
    return benchmarking.run(planned, _echo)


def cmd_eval(args) -> int:
    if args.judge:
        return judge.cmd_judge(args)
    if args.benchmark:
        return saved_result(args.json, lambda: _benchmark(args), benchmarks.table)
    return saved_result(args.json, lambda: _evaluate(args), evals.table)


# ---------------------------------------------------------------- export-metrics


def cmd_export_metrics(args) -> int:
    run = RunStore(args.runs_dir).get(args.run)
    if not run.metrics_path.is_file():
        raise RunError(message=f"{run.id} has no metrics.jsonl yet", fix="export a run that has trained a step")
    if importlib.util.find_spec("tensorboard") is None:
        raise UserError(message="--tensorboard needs the tensorboard package, which is not installed",
                        fix="pip install 'llmtui[tensorboard]'")
    code, _errors = _run_tool(["tb_export", str(run.path), "--out", str(args.tensorboard)])
    return EXIT_OK if code == 0 else EXIT_FAILED


# ---------------------------------------------------------------- parser


def add_commands(add) -> None:
    p = add("chat", cmd_chat, "talk to a run's model (final or a checkpoint), or its base, or both")
    p.add_argument("run")
    p.add_argument("--checkpoint", type=numbers.count(), default=None, metavar="N", help="checkpoint-N instead of final/")
    who = p.add_mutually_exclusive_group()
    who.add_argument("--base", action="store_true", help="the base model the run started from")
    who.add_argument("--vs-base", action="store_true", help="the tuned model and its base, one after the other")
    p.add_argument("--vs", default=None, metavar="RUN2", help="an arena: RUN2's final model answers each message "
                   "too, with RUN's settings (with --vs-base: and RUN's base)")
    p.add_argument("--single-turn", action="store_true", help="answer each message alone (no conversation history)")
    p.add_argument("--prompt", default=None, metavar="TEXT", help="answer once and exit")
    p.add_argument("--image", action="append", default=None, metavar="PATH", help="an image the first message "
                   "shows a vision-language model (repeat for more; in the chat, /image PATH attaches one)")
    p.add_argument("--json", action="store_true", help="with --prompt: one JSON document")
    p.add_argument("--system", default=None, help="system prompt (default: the run's generate.system)")
    p.add_argument("--temperature", type=numbers.non_negative(), default=None, help="0 = greedy (default: generate.temperature)")
    p.add_argument("--top-p", type=numbers.fraction(low_open=True), default=None)
    p.add_argument("--max-new-tokens", type=numbers.count(), default=None)

    p = add("eval", cmd_eval, "loss, perplexity and answer scores of a run's model vs its base on held-out data")
    p.add_argument("run")
    p.add_argument("--data", default=None, help="a local file (.json .jsonl .csv .parquet .txt), a folder, or "
                   "a demo (default: the held-out split of the demo the run trained on, demo:shapes-heldout for "
                   "demo:shapes, else demo:facts-heldout)")
    p.add_argument("--format", default="auto", choices=("auto", *FORMATS))
    p.add_argument("--columns", default="", metavar="ROLE=COL,...", help="column names, as the recipe's "
                   "dataset.columns: prompt=question,response=answer")
    p.add_argument("--checkpoint", type=numbers.count(), default=None, metavar="N")
    p.add_argument("--no-base", action="store_true", help="only the tuned model")
    p.add_argument("--limit", type=numbers.count(0), default=0, help="first N records only (0 = all)")
    p.add_argument("--gen-limit", type=numbers.count(0), default=50, help="prompt→response records answered for exact match "
                   "and ROUGE-L (0 = none)")
    p.add_argument("--tasks", default="", help="lm-evaluation-harness tasks, comma-separated (package and data "
                   "must be here)")
    p.add_argument("--benchmark", action="append", default=None, metavar="TASK_OR_YAML", help="instead of held-out "
                   "data: an lm-eval task (registry name, a task YAML over local files, or demo:facts-mc) scored on "
                   "the final model and its base, saved in runs/<id>/bench/ (repeat for more)")
    p.add_argument("--checkpoints", choices=("final", "all"), default="final", help="with --benchmark: all = a "
                   "score per kept checkpoint too")
    p.add_argument("--num-fewshot", type=numbers.count(0), default=0, help="with --benchmark: examples before each question")
    p.add_argument("--chat-template", action="store_true", help="with --benchmark: questions through the chat "
                   "template")
    judge.add_flags(p)
    p.add_argument("--json", action="store_true")

    p = add("export-metrics", cmd_export_metrics, "write a run's metrics as TensorBoard event files")
    p.add_argument("run")
    p.add_argument("--tensorboard", required=True, metavar="DIR", help="log dir; the run goes to DIR/<run id>/")
