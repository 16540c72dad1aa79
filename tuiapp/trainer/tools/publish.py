"""`llmtui export`: the export (tuiapp.trainer.tools.export: the adapter alone, or merged), then its
weights cast to `--dtype`, then `--push owner/name` to the Hugging Face Hub.

    python -m tuiapp.trainer.tools.publish FINAL --out DIR [--merge] [--dtype bfloat16] [--push owner/name]

A failed push leaves the export in DIR and says so.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tuiapp.core.common import trainer_tools
from tuiapp.core.run_folder.rundir import RunDir
from tuiapp.trainer.tools.quiet import quiet_libraries

DTYPES = ("float32", "bfloat16", "float16")


def cast_folder(folder: Path, dtype_name: str) -> int:
    """Cast the floating-point weights of an exported folder (a full model's or an adapter's
    safetensors, a bottleneck adapter's .pt) to `dtype_name`; the number of files rewritten."""
    import json

    import torch
    from safetensors.torch import load_file, save_file

    dtype = getattr(torch, dtype_name)
    done = 0
    for path in sorted(folder.glob("*.safetensors")):
        tensors = load_file(str(path))
        save_file({k: v.to(dtype) if v.is_floating_point() else v for k, v in tensors.items()}, str(path),
                  metadata={"format": "pt"})
        done += 1
    for path in sorted(folder.glob("*.pt")):
        state = torch.load(path, map_location="cpu", weights_only=True)
        torch.save({k: v.to(dtype) if torch.is_tensor(v) and v.is_floating_point() else v
                    for k, v in state.items()}, path)
        done += 1
    config = folder / "config.json"
    if config.exists():  # a full model records its dtype, which loaders follow
        data = json.loads(config.read_text())
        data["dtype"] = dtype_name
        data.pop("torch_dtype", None)
        config.write_text(json.dumps(data, indent=2) + "\n")
    return done


def push(folder: Path, repo_id: str) -> str:
    """Upload the folder to a model repo (created when missing); its URL."""
    from huggingface_hub import HfApi, constants, get_token

    if constants.HF_HUB_OFFLINE:
        raise RuntimeError("HF_HUB_OFFLINE is set, so nothing can be pushed")
    if not get_token():
        raise RuntimeError("not logged in to the Hugging Face Hub (no token); run `hf auth login` or set HF_TOKEN")
    api = HfApi()
    url = api.create_repo(repo_id, exist_ok=True, repo_type="model")
    api.upload_folder(repo_id=repo_id, folder_path=str(folder), repo_type="model",
                      commit_message="llmtui export", ignore_patterns=["training_args.bin"])
    return str(url)


def _shipping(args) -> dict | None:
    """The tools and prompts of the GGUF export and the parity checks; None after printing why not."""
    from tuiapp.core.after import gguf_tools as gguf
    from tuiapp.core.after.modelfile import ChatTemplateError
    from tuiapp.trainer.tools import export as exporting
    from tuiapp.trainer.tools import parity

    recipe = None
    if RunDir(args.final.parent).recipe_toml.is_file():
        from tuiapp.core.common.errors import UserError
        from tuiapp.trainer.tools.inference import frozen_recipe

        try:
            recipe = frozen_recipe(args.final.parent)
        except UserError:  # a recipe an older llmtui froze: its prompts and settings are the defaults
            recipe = None
    try:
        quants = gguf.parse_quants(args.gguf) if args.gguf else []
        tools = gguf.check_tools(exporting.config_dir(args.final), quants, args.llama_cpp, not args.no_parity) \
            if quants else {}
        if quants:
            gguf.check_vocabulary(tools["architecture"], exporting.vocabulary_sources(args.final))
        prompts = None if args.no_parity else parity.read_prompts(args.parity_prompts, recipe)
        if quants:  # the Modelfile's template must be derivable from the chat template, before any work
            from tuiapp.trainer.models.model import load_tokenizer
            from tuiapp.trainer.tools.gguf import chat_format

            chat_format(load_tokenizer(str(args.final), False))
    except ChatTemplateError as exc:
        print(f"error: {args.final}: the chat template cannot be written as an Ollama Modelfile: {exc}\n"
              "  fix: export without --gguf, or train with a standard dataset.template (chatml, llama3, gemma...)",
              file=sys.stderr)
        return None
    except gguf.ToolError as exc:
        print(f"error: {exc.message}\n  fix: {exc.fix}", file=sys.stderr)
        return None
    except (OSError, ValueError) as exc:
        print(f"error: --parity-prompts: {exc}\n  fix: one prompt per line, or JSON lines with \"prompt\"",
              file=sys.stderr)
        return None
    return {"quants": quants, "tools": tools, "prompts": prompts, "recipe": recipe}


def _ship(args, shipping: dict) -> int:
    """After the export: the merged-vs-adapter parity, then GGUF files, Modelfile and their parity;
    export.json records it all. 1 when a parity check fails (the files stay)."""
    import json

    from tuiapp.core.after.parity import DEFAULT_MIN_AGREEMENT, lines
    from tuiapp.trainer.tools import export as exporting

    record: dict = {"source": str(args.final), "merged": bool(args.merge or args.gguf), "parity": []}
    failed = False
    recipe, prompts = shipping["recipe"], shipping["prompts"]
    system = recipe.generate.system if recipe is not None else ""
    if record["merged"] and exporting.answers_as_adapter(args.final) and prompts:
        report = exporting.merged_parity(args.final, args.out, prompts, system, args.dtype)
        print("\n".join(lines(report)), flush=True)
        record["parity"].append({"quant": None, **report.as_dict()})
        failed |= not report.passed
    if shipping["quants"]:
        minimum = args.parity_min if args.parity_min is not None else DEFAULT_MIN_AGREEMENT
        try:
            shipped = exporting.ship_gguf(args.out, shipping["quants"], shipping["tools"], recipe, prompts, minimum,
                                          args.final.parent.name)
        except RuntimeError as exc:
            print(f"error: {exc}\n  fix: see the converter's output above; the HF export is in {args.out}",
                  file=sys.stderr)
            return 1
        record["parity"] += shipped.pop("parity")
        record.update(shipped)
        failed |= not all(r["passed"] for r in record["parity"])
    if record["parity"] or shipping["quants"]:
        (args.out / exporting.EXPORT_RECORD).write_text(json.dumps(record, indent=2) + "\n")
    if failed:
        print(f"error: the exported model does not answer as the trained one (parity above); the files are kept in "
              f"{args.out}\n  fix: check the chat template and tokenizer of the export, or try a higher-precision "
              "type (q8_0, f16)", file=sys.stderr)
        return 1
    return 0


def main(argv=None) -> int:
    quiet_libraries()
    from tuiapp.trainer.tools.export import export

    parser = argparse.ArgumentParser(prog=trainer_tools.prog("publish"))
    parser.add_argument("final", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--merge", action="store_true")
    parser.add_argument("--dtype", choices=DTYPES, default=None)
    parser.add_argument("--push", default=None, metavar="OWNER/NAME")
    parser.add_argument("--gguf", default=None, metavar="Q,Q", help="GGUF files of these types (merges first)")
    parser.add_argument("--llama-cpp", type=Path, default=None)
    parser.add_argument("--no-parity", action="store_true")
    parser.add_argument("--parity-prompts", type=Path, default=None)
    parser.add_argument("--parity-min", type=float, default=None)
    args = parser.parse_args(argv)
    shipping = _shipping(args)  # everything --gguf needs, refused before any work
    if shipping is None:
        return 2
    try:
        print(export(args.final, args.out, args.merge or bool(args.gguf)))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    code = _ship(args, shipping)
    if code:
        return code
    if args.dtype:
        count = cast_folder(args.out, args.dtype)
        print(f"cast {count} weight file{'' if count == 1 else 's'} to {args.dtype}")
    if args.push:
        try:
            url = push(args.out, args.push)
        except Exception as exc:  # offline, no token, no network, no rights: the export stays
            print(f"error: could not push {args.out} to {args.push}: {type(exc).__name__}: {exc}\n"
                  f"  fix: check the network and your token (`hf auth login`); the export is in {args.out}, "
                  "push it later with `hf upload`", file=sys.stderr)
            return 2
        print(f"pushed {args.out} to {url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
