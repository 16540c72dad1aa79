"""`llmtui export RUN --out DIR`: a run's adapter or merged model written to a folder, cast
(--dtype), as GGUF files with a parity check (--gguf), uploaded to the Hub (--push). The flags are
checked by tuiapp.core.after.exporting, before any work; the export itself is a torch-side tool
(tuiapp.trainer.tools.publish) in a child process."""

from __future__ import annotations

from tuiapp.cli import numbers
from tuiapp.cli.shared import trainer_tool
from tuiapp.core.after import exporting
from tuiapp.core.store.runs import RunStore


def cmd_export(args) -> int:
    run = RunStore(args.runs_dir).get(args.run)
    planned = exporting.plan(run, export_request(args))  # every check, before any work
    code = trainer_tool(exporting.TOOL, planned.argv)  # export, then --dtype and --push
    if code == 0 and planned.ollama:
        exporting.register_with_ollama(planned)
        print(f"ollama: created {planned.ollama[2]} (ollama run {planned.ollama[2]})")
    if code == 0:  # an open TUI shows it (the run view, the history's detail line)
        exporting.record(planned, exporting.written(planned.out))
    return code


def export_request(args) -> exporting.ExportRequest:
    return exporting.ExportRequest(out=args.out, merge=args.merge, dtype=args.dtype, push=args.push, gguf=args.gguf,
                                   llama_cpp=args.llama_cpp, no_parity=args.no_parity,
                                   parity_prompts=args.parity_prompts, parity_min=args.parity_min,
                                   ollama=args.ollama)


def add_export_arguments(p) -> None:
    p.add_argument("--dtype", choices=exporting.DTYPES, default=None,
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
    p.add_argument("--parity-min", type=numbers.fraction(), default=None, metavar="F",
                   help="lowest token agreement of a GGUF that passes (default 0.75)")
    p.add_argument("--ollama", default=None, metavar="NAME",
                   help="with --gguf: then `ollama create NAME` from the Modelfile (needs the ollama command)")


# ---------------------------------------------------------------- parser


def add_command(add) -> None:
    p = add("export", cmd_export, "write a run's adapter or merged model to a folder")
    p.add_argument("run")
    p.add_argument("--out", required=True)
    p.add_argument("--merge", action="store_true", help="merge the adapter into its base model")
    add_export_arguments(p)
