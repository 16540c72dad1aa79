"""`llmtui export RUN --out DIR`: a run's adapter or merged model written to a folder, cast
(--dtype), as GGUF files with a parity check (--gguf), uploaded to the Hub (--push). The flags are
checked here, before any work; the export itself is a torch-side tool (tuiapp.trainer.publish) in a
child process."""

from __future__ import annotations

from pathlib import Path

from tuiapp.cli.shared import trainer_tool
from tuiapp.core import gguf_tools
from tuiapp.core.errors import UserError
from tuiapp.core.model_check import hub_offline
from tuiapp.core.runs import RunStore


def cmd_export(args) -> int:
    run = RunStore(args.runs_dir).get(args.run)
    if not run.final_path.is_dir():
        raise UserError(message=f"{run.id} has no final model ({run.status})", fix="export a succeeded run")
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        raise UserError(message=f"{out} exists and is not empty", fix="choose a new folder for --out")
    argv = [str(run.final_path), "--out", str(out)] + (["--merge"] if args.merge else []) + export_argv(args)
    return trainer_tool("tuiapp.trainer.publish", argv)  # export, then --dtype and --push


def check_push(repo_id: str | None) -> None:
    """`llmtui export --push`: refused before any work when the hub cannot be reached."""
    if repo_id is None:
        return
    if "/" not in repo_id or repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise UserError(message=f"--push '{repo_id}' is not a repo id", fix="use --push owner/name")
    if hub_offline():
        raise UserError(message=f"--push {repo_id} needs the network, and HF_HUB_OFFLINE is set (offline)",
                        fix="unset HF_HUB_OFFLINE and log in (`hf auth login`), or export without --push and "
                        "upload the folder later (`hf upload`)")


def export_argv(args) -> list[str]:
    """The export tool's extra arguments: --dtype, --push, and the GGUF export's and parity check's."""
    check_push(args.push)
    argv = (["--dtype", args.dtype] if args.dtype else []) + (["--push", args.push] if args.push else [])
    if args.llama_cpp is not None and not Path(args.llama_cpp).expanduser().is_dir():
        raise UserError(message=f"--llama-cpp {args.llama_cpp} is not a folder",
                        fix="name the root of a llama.cpp checkout (git clone https://github.com/ggml-org/llama.cpp)")
    if args.llama_cpp is not None and not args.gguf:
        raise UserError(message="--llama-cpp is for --gguf", fix="add --gguf q8_0 (or leave out --llama-cpp)")
    if args.parity_prompts is not None and not Path(args.parity_prompts).is_file():
        raise UserError(message=f"--parity-prompts {args.parity_prompts} is not a file",
                        fix="one prompt per line, or JSON lines with \"prompt\"")
    if args.parity_min is not None and not 0 <= args.parity_min <= 1:
        raise UserError(message=f"--parity-min {args.parity_min} is out of range", fix="use 0 to 1, e.g. 0.75")
    for flag, value in (("--gguf", args.gguf), ("--llama-cpp", args.llama_cpp), ("--parity-prompts",
                                                                                args.parity_prompts)):
        if value:
            argv += [flag, str(Path(value).expanduser().resolve()) if flag != "--gguf" else value]
    if args.gguf:  # the tools, found before any work (the tool adds the architecture check)
        gguf_tools.check_tools(None, gguf_tools.parse_quants(args.gguf),
                               Path(args.llama_cpp).expanduser() if args.llama_cpp else None, not args.no_parity)
    if args.parity_min is not None:
        argv += ["--parity-min", str(args.parity_min)]
    return argv + (["--no-parity"] if args.no_parity else [])


def add_export_arguments(p) -> None:
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None,
                   help="cast the exported weights (e.g. bfloat16 halves a float32 model)")
    p.add_argument("--push", default=None, metavar="OWNER/NAME",
                   help="then upload the export to this Hugging Face Hub model repo (needs the network and a token)")
    p.add_argument("--gguf", default=None, metavar="TYPES",
                   help="also GGUF files (llama.cpp, Ollama) of these types, e.g. q8_0,q4_k_m (merges an adapter "
                   "first), with an Ollama Modelfile and a parity check")
    p.add_argument("--llama-cpp", default=None, metavar="DIR",
                   help="the llama.cpp folder whose convert_hf_to_gguf.py (and build/bin/llama-quantize) to use")
    p.add_argument("--no-parity", action="store_true", help="skip the parity checks (greedy answers of the export "
                   "vs the trained model)")
    p.add_argument("--parity-prompts", default=None, metavar="FILE", help="prompts of the parity check, one per "
                   "line (default: the recipe's train.sample_prompts)")
    p.add_argument("--parity-min", type=float, default=None, metavar="F",
                   help="lowest token agreement of a GGUF that passes (default 0.75)")


# ---------------------------------------------------------------- parser


def add_command(add) -> None:
    p = add("export", cmd_export, "write a run's adapter or merged model to a folder")
    p.add_argument("run")
    p.add_argument("--out", required=True)
    p.add_argument("--merge", action="store_true", help="merge the adapter into its base model")
    add_export_arguments(p)
