"""`llmtui export` and the TUI's Export: a run's adapter or merged model written to a folder, cast
(dtype), as GGUF files with a parity check (gguf), uploaded to the Hub (push). Every option is
checked here, before any work; the export itself is the torch-side tool tuiapp.trainer.tools.publish in
a child process."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tuiapp.core.after import gguf_tools
from tuiapp.core.after.targets import base_of, final_weights, require_base
from tuiapp.core.common.child_tool import ChildTool
from tuiapp.core.common.errors import RunError, UserError
from tuiapp.core.common.methods import mergeable
from tuiapp.core.prelaunch.model_check import adapter_kind, hub_offline
from tuiapp.core.run_folder import exports
from tuiapp.core.store.runs import Run

TOOL = "publish"  # trainer_tools.TOOLS
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
    ollama: str | None = None  # then `ollama create NAME -f OUT/Modelfile`


@dataclass
class ExportPlan:
    run_id: str
    out: Path
    argv: list[str]
    ollama: list[str] | None = None  # the `ollama create` command, run after the export
    run_dir: Path | None = None  # where the export's record goes (runs/<id>/exports/)
    request: ExportRequest | None = None


OLLAMA_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9._/-]*(:[a-zA-Z0-9._-]+)?$")


def ollama_command(name: str | None, gguf: str | None, out: Path) -> list[str] | None:
    """--ollama NAME: `ollama create NAME -f OUT/Modelfile` after the GGUF export; refused before any
    work without --gguf, without the ollama command, or with a name Ollama would refuse."""
    if name is None:
        return None
    if not gguf:
        raise UserError(message="--ollama registers the GGUF export with Ollama", fix="add --gguf q8_0 (or q4_k_m)")
    if not OLLAMA_NAME.match(name):
        raise UserError(message=f"--ollama '{name}' is not an Ollama model name",
                        fix="use letters, digits, '.', '_', '-' and '/', with an optional ':tag', e.g. my-model:q8")
    found = shutil.which("ollama")
    if found is None:
        raise UserError(message="--ollama needs the ollama command, which is not on PATH",
                        fix=f"install Ollama (https://ollama.com/download), or leave out --ollama and run "
                        f"`ollama create {name} -f {out / 'Modelfile'}` later")
    return [found, "create", name, "-f", str(out / "Modelfile")]


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
        check_gguf_tools(request)
    if request.parity_min is not None:
        argv += ["--parity-min", str(request.parity_min)]
    return argv + (["--no-parity"] if request.no_parity else [])


def check_gguf_tools(request: ExportRequest) -> dict:
    """The GGUF export's tools (converter, quantizer, llama-cpp-python for the parity check), found
    before any work; gguf_tools.ToolError says what is missing and the fix."""
    return gguf_tools.check_tools(None, gguf_tools.parse_quants(request.gguf or ""),
                                  Path(request.llama_cpp).expanduser() if request.llama_cpp else None,
                                  not request.no_parity)


def gguf_readiness(request: ExportRequest) -> str:
    """What the GGUF part of an export will use, in one line ('' without --gguf); UserError when it
    would be refused: the same checks as `plan` (the form shows this before starting)."""
    tool_options(request)  # every refusal `plan` makes of the options, the tools' included
    ollama_command(request.ollama, request.gguf, Path(request.out or ".").expanduser())
    if not request.gguf:
        return ""
    found = check_gguf_tools(request)
    quants = gguf_tools.parse_quants(request.gguf)
    parts = [f"GGUF {', '.join(quants)} with {found['converter']}"]
    if found.get("quantize"):
        parts.append(f"quantized by {Path(found['quantize']).name}")
    parts.append(f"parity via llama-cpp-python {found['llama_cpp_python']}" if not request.no_parity else "no parity check")
    if request.ollama:
        parts.append(f"then ollama create {request.ollama}")
    return " · ".join(parts)


def check_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise UserError(message=f"{out} is a file", fix="choose a new folder for --out")
    if out.exists() and any(out.iterdir()):
        raise UserError(message=f"{out} exists and is not empty", fix="choose a new folder for --out")


def check_merge(run: Run, request: ExportRequest) -> None:
    """--merge with no adapter to merge, or (--merge or --gguf, which merges) an adapter that cannot
    merge into plain weights: refused here, not by the export tool after it loaded the model."""
    if not (request.merge or request.gguf):
        return
    kind, method = adapter_kind(run.final_path), final_weights(run.path)
    if kind is None and request.merge:
        raise UserError(message=f"{run.id} trained every weight: its final model is already whole, with no adapter "
                        "to merge", key="--merge", fix="export without --merge")
    option = "--merge" if request.merge else "--gguf"
    if kind == "bottleneck":
        raise UserError(message=f"{run.id}'s bottleneck adapters add layers: they cannot merge into a plain "
                        f"model, which {option} needs", key=option, fix="export the adapter alone (no --merge, no --gguf)")
    if not mergeable(method):
        raise UserError(message=f"{run.id}'s {method} adapter adds virtual tokens or gated prompts, not weight "
                        f"deltas: it cannot merge into its base, which {option} needs", key=option,
                        fix="export the adapter alone (no --merge, no --gguf)")


def plan(run: Run, request: ExportRequest) -> ExportPlan:
    """Every check, before any work: a final model, an empty --out, the options; UserError names the fix."""
    if not run.final_path.is_dir():
        raise UserError(message=f"{run.id} has no final model ({run.status})", fix="export a succeeded run")
    if not str(request.out).strip():
        raise UserError(message="no folder to export to", key="--out", fix="name a new (or empty) folder")
    check_merge(run, request)
    if (request.merge or request.gguf) and adapter_kind(run.final_path):  # merging loads the base
        require_base(run.id, base_of(run.path), "its adapter merges into")
    out = Path(request.out).expanduser()
    check_out(out)
    argv = [str(run.final_path), "--out", str(out)] + (["--merge"] if request.merge else []) + tool_options(request)
    return ExportPlan(run.id, out, argv, ollama_command(request.ollama, request.gguf, out.resolve()), run.path, request)


def register_with_ollama(planned: ExportPlan) -> None:
    """`ollama create` of the exported Modelfile (its FROM is the GGUF file beside it); RunError when
    Ollama refuses, with what it said."""
    if planned.ollama is None:
        return
    done = subprocess.run(planned.ollama, cwd=planned.out, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise RunError(message=f"ollama create {planned.ollama[2]} failed: {said[-1] if said else done.returncode}",
                       fix=f"is the Ollama server running (`ollama serve`)? The export is in {planned.out}; run "
                       f"`{' '.join(planned.ollama[1:])}` again")


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
    register_with_ollama(planned)
    files = written(planned.out)
    record(planned, files)
    return files


def record(planned: ExportPlan, files: list[str]) -> None:
    """The export's record in the run folder (the TUI shows it live: history detail, run view)."""
    if planned.run_dir is None:
        return
    request = planned.request or ExportRequest(out=str(planned.out))
    exports.record(planned.run_dir, {
        "out": str(planned.out.resolve()), "merged": bool(request.merge or request.gguf), "dtype": request.dtype,
        "gguf": request.gguf, "push": request.push, "ollama": request.ollama, "files": len(files)})


def written(folder: Path) -> list[str]:
    """The files of an export, relative to it, sorted."""
    if not folder.is_dir():
        return []
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
