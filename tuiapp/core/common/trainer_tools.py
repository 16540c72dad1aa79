"""The torch-side tools, each run in a child process (`python -m MODULE ...`): one table from a tool's
short name to its module, for every launcher (the CLI, the TUI, core's plans and checks) and for the
tools' own usage lines. Pure: names only, nothing of the trainer is imported here.

The rank's own entry is the trainer package itself (RANK: `python -m tuiapp.trainer`, or `--module` under
the DeepSpeed launcher). tests/test_trainer_tools.py checks that every module here exists and has a
main, and that no other file of tuiapp/ writes a trainer module's dotted name."""

from __future__ import annotations

import sys

RANK = "tuiapp.trainer"

TOOLS: dict[str, str] = {
    "dry": "tuiapp.trainer.tools.dry",  # the dry step: a recipe's first steps on a tiny model (prelaunch)
    "probe": "tuiapp.trainer.tools.probe",  # micro-batch sizes' peak memory (plan), a rank of its own
    "profile": "tuiapp.trainer.models.profile",  # a model's facts from its config (`llmtui model`, preflight)
    "preview": "tuiapp.trainer.tools.preview",  # the first training examples (`llmtui data`, the TUI)
    "evaluate": "tuiapp.trainer.tools.evaluate",  # `llmtui eval`: a prompt set's answers
    "benchmarks": "tuiapp.trainer.tools.benchmarks",  # `llmtui eval --benchmark`: lm-evaluation-harness
    "publish": "tuiapp.trainer.tools.publish",  # `llmtui export`: export, convert, push
    "gguf_convert": "tuiapp.trainer.tools.gguf_convert",  # llama.cpp's converter, run by the export
    "merge": "tuiapp.trainer.tools.merge",  # `llmtui merge`: model soups, TIES, DARE, ...
    "serve": "tuiapp.trainer.tools.serve",  # chat with a run's model (`llmtui chat`, the TUI)
    "openai_server": "tuiapp.trainer.tools.openai_server",  # `llmtui serve`: an OpenAI-compatible server
    "tb_export": "tuiapp.trainer.tools.tb_export",  # `llmtui after --tensorboard`
}


def module(tool: str) -> str:
    """The module of a tool named in TOOLS; KeyError naming the known tools otherwise."""
    try:
        return TOOLS[tool]
    except KeyError:
        raise KeyError(f"no trainer tool {tool!r}; known: {', '.join(sorted(TOOLS))}") from None


def argv(tool: str, args: list[str], python: str | None = None) -> list[str]:
    """The command line that runs `tool` with `args` in a fresh interpreter (this one by default)."""
    return [python or sys.executable, "-m", module(tool), *args]


def prog(tool: str) -> str:
    """A tool's name in its own usage line."""
    return f"python -m {module(tool)}"
