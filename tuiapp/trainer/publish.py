"""`llmtui export`: the export (tuiapp.trainer.export: the adapter alone, or merged), then its
weights cast to `--dtype`, then `--push owner/name` to the Hugging Face Hub.

    python -m tuiapp.trainer.publish FINAL --out DIR [--merge] [--dtype bfloat16] [--push owner/name]

A failed push leaves the export in DIR and says so.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

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


def main(argv=None) -> int:
    from tuiapp.trainer.export import export

    parser = argparse.ArgumentParser(prog="python -m tuiapp.trainer.publish")
    parser.add_argument("final", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--merge", action="store_true")
    parser.add_argument("--dtype", choices=DTYPES, default=None)
    parser.add_argument("--push", default=None, metavar="OWNER/NAME")
    args = parser.parse_args(argv)
    try:
        print(export(args.final, args.out, args.merge))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.dtype:
        count = cast_folder(args.out, args.dtype)
        print(f"cast {count} weight file(s) to {args.dtype}")
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
