"""`llmtui eval RUN --judge ENDPOINT_OR_RUN`: an LLM judges the run's answers (tuiapp.core.after.judging)."""

from __future__ import annotations

import sys

from tuiapp.cli.shared import saved_result
from tuiapp.core.after import judging
from tuiapp.core.store.runs import RunStore

DEFAULT_PROMPTS = 20


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _judge(args) -> dict:
    store = RunStore(args.runs_dir)
    run = store.get(args.run)
    request = judging.JudgeRequest(judge=args.judge, judge_model=args.judge_model, mode=args.judge_mode,
                                   against=args.against, prompts=args.prompts or judging.DEMO_PROMPTS,
                                   limit=args.limit or DEFAULT_PROMPTS, rubric=args.rubric or "")
    planned = judging.plan(run.path, request, store)  # every check (the judge answers), before any model loads
    _say(planned.summary)
    return judging.run(planned, _say)


def cmd_judge(args) -> int:
    return saved_result(args.json, lambda: _judge(args), judging.summary_lines)


def add_flags(p) -> None:
    p.add_argument("--judge", default=None, metavar="ENDPOINT_OR_RUN", help="instead of held-out data: an LLM "
                   "judges the run's answers; an OpenAI-compatible endpoint (http://host:port/v1, key in "
                   f"${judging.KEY_ENV}) or a run served by `llmtui serve`")
    p.add_argument("--judge-model", default=None, help="with --judge ENDPOINT: the model to ask (default: the "
                   "endpoint's first)")
    p.add_argument("--judge-mode", choices=("pairwise", "single"), default="pairwise", help="pairwise: against "
                   "--against (win rates); single: a 1-10 rating per answer")
    p.add_argument("--against", default="base", metavar="base|RUN", help="with --judge pairwise: the base model "
                   "(default) or another run's final model")
    p.add_argument("--prompts", default=None, metavar="FILE", help=f"with --judge: a .txt or .jsonl prompt set "
                   f"(default {judging.DEMO_PROMPTS}; --limit N of them, {DEFAULT_PROMPTS} by default)")
    p.add_argument("--rubric", default=None, help="with --judge: the judge's instructions (default: a pairwise "
                   "[[A]]/[[B]]/[[C]] or a 1-10 'Rating: [[N]]' rubric)")
