"""The `llmtui` parser, assembled from each command group's adders, and `main`.

The order of the adders is the order `llmtui --help` lists the commands in. No command group
imports torch, transformers, deepspeed or textual: the TUI is imported lazily (tuiapp.ui.launch),
and commands that need torch run it in a child process.
"""

from __future__ import annotations

import argparse
import sys

from tuiapp.cli import after, cache, export, manage, merge, model, probe, recipe, reproduce, run, runs, serve, serve_ui
from tuiapp.core.common.errors import exit_code


def cmd_tui(args) -> int:
    from tuiapp.ui.launch import open_tui

    return open_tui(args.runs_dir)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llmtui", description="Train and fine-tune LLMs from the terminal.")
    parser.add_argument("--runs-dir", default=None, help="runs folder (default: $LLMTUI_RUNS_DIR or ./runs)")
    sub = parser.add_subparsers(dest="command")

    def add(name, func, help_text):
        p = sub.add_parser(name, help=help_text)
        p.set_defaults(func=func)
        p.add_argument("--runs-dir", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        return p

    run.add_run(add)
    recipe.add_checks(add)  # validate, estimate, schema
    runs.add_list(add)
    manage.add_commands(add)  # queue, sweep, tag, note, rename, archive, delete, trash
    runs.add_show(add)
    run.add_control(add)  # stop, resume, doctor
    reproduce.add_command(add)
    recipe.add_data(add)
    export.add_command(add)
    merge.add_command(add)
    after.add_commands(add)  # chat, eval, export-metrics
    probe.add_command(add)
    cache.add_command(add)  # cache list, prune
    model.add_command(add)
    serve_ui.add_command(add)
    serve.add_commands(add)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "runs_dir", None):
        args.runs_dir = None
    func = getattr(args, "func", cmd_tui)
    return exit_code(lambda: func(args))


if __name__ == "__main__":
    sys.exit(main())
