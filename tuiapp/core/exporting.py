"""`llmtui export` and the TUI's Export: a run's adapter or merged model written to a folder, cast
(dtype), as GGUF files with a parity check (gguf), uploaded to the Hub (push). Every option is
checked here, before any work; the export itself is the torch-side tool tuiapp.trainer.publish in
a child process."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tuiapp.core import gguf_tools
from tuiapp.core.child_tool import ChildTool
from tuiapp.core.errors import RunError, UserError
from tuiapp.core.model_check import hub_offline
from tuiapp.core.runs import Run

TOOL = "tuiapp.trainer.publish"
DTYPES = ("float32", "bfloat16", "float16")


@dataclass
class ExportRequest:
    out: str
    merge: bool = False
    dtype: str | None = None
    push: str | None = None
    gguf: str | None = None
    llama_cpp: str | None = None
    no_parity: bool = False
    parity_prompts: str | None = None
    parity_min: float | None = None


@dataclass
class ExportPlan:
    run_id: str
    out: Path
    argv: list[str]


def check_push(repo_id: str | None) -> None:
    """--push: refused before any work when the hub cannot be reached."""
    if repo_id is None:
        return
    if "/" not in repo_id or repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise UserError(message=f"--push '{repo_id}' is not a repo id", fix="use --push owner/name")
    if hub_offline():
        raise UserError(message=f"--push {repo_id} needs the network, and HF_HUB_OFFLINE is set (offline)",
                        fix="unset HF_HUB_OFFLINE and log in (`hf auth login`), or export without --push and "
                        "upload the folder later (`hf upload`)")


def tool_options(request: ExportRequest) -> list[str]:
    """The export tool's extra arguments: --dtype, --push, and the GGUF export's and parity check's."""
    check_push(request.push)
    if request.dtype is not None and request.dtype not in DTYPES:
        raise UserError(message=f"--dtype {request.dtype} is not a weight type", fix=f"use one of {', '.join(DTYPES)}")
    argv = (["--dtype", request.dtype] if request.dtype else []) + (["--push", request.push] if request.push else [])
    if request.llama_cpp is not None and not Path(request.llama_cpp).expanduser().is_dir():
        raise UserError(message=f"--llama-cpp {request.llama_cpp} is not a folder",
                        fix="name the root of a llama.cpp checkout (git clone https://github.com/ggml-org/llama.cpp)")
    if request.llama_cpp is not None and not request.gguf:
        raise UserError(message="--llama-cpp is for --gguf", fix="add --gguf q8_0 (or leave out --llama-cpp)")
    if request.parity_prompts is not None and not Path(request.parity_prompts).is_file():
        raise UserError(message=f"--parity-prompts {request.parity_prompts} is not a file",
                        fix="one prompt per line, or JSON lines with \"prompt\"")
    if request.parity_min is not None and not 0 <= request.parity_min <= 1:
        raise UserError(message=f"--parity-min {request.parity_min} is out of range", fix="use 0 to 1, e.g. 0.75")
    for flag, value in (("--gguf", request.gguf), ("--llama-cpp", request.llama_cpp),
                        ("--parity-prompts", request.parity_prompts)):
        if value:
            argv += [flag, str(Path(value).expanduser().resolve()) if flag != "--gguf" else value]
    if request.gguf:  # the tools, found before any work (the tool adds the architecture check)
        gguf_tools.check_tools(None, gguf_tools.parse_quants(request.gguf),
                               Path(request.llama_cpp).expanduser() if request.llama_cpp else None,
                               not request.no_parity)
    if request.parity_min is not None:
        argv += ["--parity-min", str(request.parity_min)]
    return argv + (["--no-parity"] if request.no_parity else [])


def check_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise UserError(message=f"{out} is a file", fix="choose a new folder for --out")
    if out.exists() and any(out.iterdir()):
        raise UserError(message=f"{out} exists and is not empty", fix="choose a new folder for --out")


def plan(run: Run, request: ExportRequest) -> ExportPlan:
    """Every check, before any work: a final model, an empty --out, the options; UserError names the fix."""
    if not run.final_path.is_dir():
        raise UserError(message=f"{run.id} has no final model ({run.status})", fix="export a succeeded run")
    if not str(request.out).strip():
        raise UserError(message="no folder to export to", key="--out", fix="name a new (or empty) folder")
    out = Path(request.out).expanduser()
    check_out(out)
    argv = [str(run.final_path), "--out", str(out)] + (["--merge"] if request.merge else []) + tool_options(request)
    return ExportPlan(run.id, out, argv)


def tool(planned: ExportPlan) -> ChildTool:
    return ChildTool(TOOL, planned.argv)


def run(planned: ExportPlan, on_line: Callable[[str], None] | None = None, child: ChildTool | None = None) -> list[str]:
    """The export in a child process; the files written (names under the folder), or RunError."""
    outcome = (child or tool(planned)).run(on_line)
    if outcome.cancelled:
        raise RunError(message=f"the export was cancelled; {planned.out} may hold part of it",
                       fix=f"delete {planned.out} and export again")
    if outcome.code != 0:
        message, fix = outcome.message_and_fix(f"the export failed (exit {outcome.code})", "see the output above")
        raise RunError(message=message, fix=fix)
    return written(planned.out)


def written(folder: Path) -> list[str]:
    """The files of an export, relative to it, sorted."""
    if not folder.is_dir():
        return []
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
