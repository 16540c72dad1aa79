"""demo:shapes, the offline image demo: small drawn pictures of coloured shapes and questions about them.

Each 64x64 PNG holds 1 to 3 shapes (circle, square, triangle), each in its own column (left, middle,
right), in distinct colours. The questions ask a shape's colour, how many shapes there are, where a
shape is, or which shape is in a column; the answers are one word, so exact match scores them.
Everything is drawn from fixed seeds and written once into the llmtui cache as a messages dataset
(`shapes.jsonl`, `shapes-heldout.jsonl`) with an `images` list of paths relative to the data file.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from tuiapp.core.common.built_folder import build_once, cache_root

SHAPES_VERSION = "2"
IMAGE_SIZE = 64
TRAIN_COUNT, HELDOUT_COUNT = 600, 100
TRAIN_SEED, HELDOUT_SEED = 4242, 9191
SHAPES = ("circle", "square", "triangle")
COLOURS = {"red": (220, 30, 30), "green": (30, 170, 60), "blue": (30, 70, 220), "yellow": (235, 200, 20)}
COLUMNS = ("left", "middle", "right")
AT_COLUMN = {"left": "on the left", "middle": "in the middle", "right": "on the right"}
COUNT_WORDS = ("zero", "one", "two", "three")
DATA_FILES = {"demo:shapes": "shapes.jsonl", "demo:shapes-heldout": "shapes-heldout.jsonl"}
MARKER = "llmtui_shapes.json"


def _scene(rng: random.Random) -> list[dict]:
    """1 to 3 shapes, each {shape, colour, column}, in distinct columns and colours."""
    count = rng.randint(1, 3)
    columns = sorted(rng.sample(range(len(COLUMNS)), count))
    colours = rng.sample(sorted(COLOURS), count)
    return [{"shape": rng.choice(SHAPES), "colour": colour, "column": COLUMNS[column]}
            for column, colour in zip(columns, colours, strict=True)]


def _question(scene: list[dict], rng: random.Random) -> tuple[str, str]:
    """(question, one-word answer) about the scene."""
    kind = rng.choice(("colour", "count", "position", "shape"))
    item = rng.choice(scene)
    if kind == "count":
        return "How many shapes are in the picture?", COUNT_WORDS[len(scene)]
    if kind == "position":
        return f"Where is the {item['colour']} {item['shape']}: left, middle or right?", item["column"]
    if kind == "shape":
        return f"What shape is {AT_COLUMN[item['column']]}?", item["shape"]
    return f"What colour is the shape {AT_COLUMN[item['column']]}?", item["colour"]


def _records(count: int, seed: int, prefix: str) -> list[tuple[dict, list[dict]]]:
    """(record, scene) pairs; the record's image is images/<prefix>-NNNN.png."""
    rng = random.Random(seed)
    out = []
    for index in range(count):
        scene = _scene(rng)
        question, answer = _question(scene, rng)
        record = {"messages": [{"role": "user", "content": f"<image>{question}"},
                               {"role": "assistant", "content": answer}],
                  "images": [f"images/{prefix}-{index:04d}.png"]}
        out.append((record, scene))
    return out


def shapes_records(heldout: bool = False) -> list[dict]:
    """The records of demo:shapes (or its held-out split), image paths relative to the data file."""
    if heldout:
        return [r for r, _ in _records(HELDOUT_COUNT, HELDOUT_SEED, "heldout")]
    return [r for r, _ in _records(TRAIN_COUNT, TRAIN_SEED, "train")]


def draw(scene: list[dict]):
    """The scene as a 64x64 RGB PIL image on white."""
    from PIL import Image, ImageDraw  # lazily: only the image demo needs PIL

    image = Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE), (255, 255, 255))
    pen = ImageDraw.Draw(image)
    cell = IMAGE_SIZE // len(COLUMNS)
    for item in scene:
        left = COLUMNS.index(item["column"]) * cell + 2
        top, size = IMAGE_SIZE // 2 - (cell - 4) // 2, cell - 4
        box = (left, top, left + size, top + size)
        fill = COLOURS[item["colour"]]
        if item["shape"] == "circle":
            pen.ellipse(box, fill=fill)
        elif item["shape"] == "square":
            pen.rectangle(box, fill=fill)
        else:
            pen.polygon([(left + size // 2, top), (left, top + size), (left + size, top + size)], fill=fill)
    return image


def shapes_folder(cache_dir: Path | str | None = None) -> Path:
    """The folder of demo:shapes' files, drawn and written on first use (into a temporary folder
    renamed into place, so several processes may ask at once)."""
    target = Path(cache_dir or cache_root()) / "demo" / f"shapes-{SHAPES_VERSION}"
    return build_once(target, _write, _is_complete)


def data_file(name: str, cache_dir: Path | str | None = None) -> Path:
    """The JSON lines file of 'demo:shapes' or 'demo:shapes-heldout'."""
    return shapes_folder(cache_dir) / DATA_FILES[name]


def _is_complete(folder: Path) -> bool:
    try:
        return json.loads((folder / MARKER).read_text())["version"] == SHAPES_VERSION
    except (OSError, ValueError, KeyError):
        return False


def _write(folder: Path) -> None:
    (folder / "images").mkdir()
    splits = {"demo:shapes": _records(TRAIN_COUNT, TRAIN_SEED, "train"),
              "demo:shapes-heldout": _records(HELDOUT_COUNT, HELDOUT_SEED, "heldout")}
    for name, pairs in splits.items():
        lines = []
        for record, scene in pairs:
            draw(scene).save(folder / record["images"][0], format="PNG")
            lines.append(json.dumps(record))
        (folder / DATA_FILES[name]).write_text("\n".join(lines) + "\n")
    (folder / MARKER).write_text(json.dumps({"version": SHAPES_VERSION}) + "\n")
