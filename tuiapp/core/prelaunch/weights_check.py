"""Can the model folder's weights be read? Answered from the files' headers in milliseconds, before
anything is launched, so that a truncated, random or empty `model.safetensors` is refused naming the
file instead of failing inside rank 0.

A safetensors file is an 8-byte little-endian header length, a JSON header (each tensor's dtype,
shape and [begin, end) byte offsets into the data that follows) and the data. The checks:
the header parses; each tensor's byte span matches its dtype and shape and lies inside the file; the
file is exactly as long as its last tensor's end (a truncated download is shorter); and the embedding
table's shape matches config.json's vocab_size x hidden_size. A sharded model's index must name shards
that are there, each checked the same way. A `.bin` (torch zip) file must at least not be empty and
start as a zip archive does. Pure stdlib: nothing is loaded.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

# bytes per element of each safetensors dtype
DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "E4M3": 1, "E5M2": 1, "U16": 2,
               "I16": 2, "F16": 2, "BF16": 2, "U32": 4, "I32": 4, "F32": 4, "U64": 8, "I64": 8, "F64": 8}
HEADER_LIMIT = 100_000_000  # safetensors' own limit on the header's size
EMBEDDING_NAMES = ("embed_tokens.weight", "wte.weight", "word_embeddings.weight", "tok_embeddings.weight")
ZIP_MAGIC = b"PK"


def safetensors_problem(path: Path, config: dict | None = None) -> str | None:
    """Why the safetensors file cannot be read (None = it can), naming the file."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            head = handle.read(8)
            if size == 0:
                return f"{path} is empty (0 bytes)"
            if len(head) < 8:
                return f"{path} is {size} bytes, too short for a safetensors header"
            (length,) = struct.unpack("<Q", head)
            if length > HEADER_LIMIT or 8 + length > size:
                return (f"{path} is not a readable safetensors file: its header claims {length:,} bytes, "
                        f"the file holds {size:,} (random bytes, or truncated)")
            raw = handle.read(length)
    except OSError as exc:
        return f"{path} cannot be read ({exc.strerror or exc})"
    try:
        header = json.loads(raw.decode("utf-8"))
        if not isinstance(header, dict):
            raise ValueError("not a JSON object")
    except (UnicodeDecodeError, ValueError) as exc:
        return f"{path} is not a readable safetensors file: its header does not parse ({exc})"
    data_size, end_max, shapes = size - 8 - length, 0, {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = info["dtype"], list(info["shape"]), info["data_offsets"]
            count = 1
            for dim in shape:
                count *= int(dim)
            want = count * DTYPE_BYTES[dtype] if dtype in DTYPE_BYTES else end - begin
        except (KeyError, TypeError, ValueError):
            return f"{path} is not a readable safetensors file: tensor '{name}' has a malformed entry {info!r:.120}"
        if not (0 <= begin <= end) or end - begin != want:
            return (f"{path}: tensor '{name}' ({dtype} {shape}) should take {want:,} bytes, its offsets "
                    f"give {end - begin:,}")
        if end > data_size:
            return (f"{path} is truncated: tensor '{name}' ends at byte {end:,} of the data, the file holds "
                    f"{data_size:,} bytes of data")
        end_max = max(end_max, end)
        shapes[name] = shape
    if end_max != data_size:
        return f"{path} holds {data_size - end_max:,} bytes more than its tensors (a damaged or mixed file)"
    return _against_config(path, shapes, config)


def _against_config(path: Path, shapes: dict[str, list], config: dict | None) -> str | None:
    """The embedding table must be vocab_size x hidden_size of config.json (when both are known)."""
    if not config:
        return None
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    vocab, hidden = text.get("vocab_size"), text.get("hidden_size") or text.get("n_embd") or text.get("d_model")
    if not isinstance(vocab, int) or not isinstance(hidden, int) or vocab <= 0 or hidden <= 0:
        return None  # a size that is not positive is config.json's own error (model_profile names it)
    for name, shape in shapes.items():
        if name.endswith(EMBEDDING_NAMES) and len(shape) == 2:
            if shape != [vocab, hidden]:
                return (f"{path}: tensor '{name}' is {shape[0]} x {shape[1]}, but config.json says vocab_size "
                        f"{vocab} x hidden_size {hidden} (weights of another model?)")
            return None
    return None


def bin_problem(path: Path) -> str | None:
    try:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            magic = handle.read(2)
    except OSError as exc:
        return f"{path} cannot be read ({exc.strerror or exc})"
    if size == 0:
        return f"{path} is empty (0 bytes)"
    if magic != ZIP_MAGIC and size < 1024:
        return f"{path} is {size} bytes and not a torch checkpoint"
    return None


def weight_problems(folder: Path, names: set[str]) -> list[str]:
    """What is wrong with the folder's weight files ([] = they can be read)."""
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        config = config if isinstance(config, dict) else None
    except (OSError, ValueError):
        config = None
    problems = []
    for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if index_name not in names:
            continue
        try:
            weight_map = json.loads((folder / index_name).read_text(encoding="utf-8"))["weight_map"]
            shards = sorted(set(weight_map.values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            problems.append(f"{folder / index_name} does not parse as a weight index ({exc})")
            continue
        problems += [f"{folder / index_name} names the shard {shard}, which is not there"
                     for shard in shards if shard not in names]
    for name in sorted(names):
        if name.startswith(("adapter_model", "training_args")):
            continue
        if name.endswith(".safetensors"):
            problem = safetensors_problem(folder / name, config)
        elif name.endswith(".bin"):
            problem = bin_problem(folder / name)
        else:
            continue
        if problem:
            problems.append(problem)
    return problems
