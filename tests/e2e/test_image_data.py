"""Image chats checked before launch: a bad image record exits 2 naming the file, the record and the
fix, and nothing is created in runs/ (through the real CLI); demo:shapes is drawn offline."""

import json

import pytest
from PIL import Image

from tests.e2e.helpers import llmtui
from tuiapp.core.config.recipe import DatasetSpec
from tuiapp.core.data import demo_shapes
from tuiapp.core.data.datasets import inspect_dataset, load_records


def chat(question: str, answer: str, images: list[str]) -> str:
    return json.dumps({"messages": [{"role": "user", "content": question},
                                    {"role": "assistant", "content": answer}], "images": images})


def image_data(folder, bad_line: str):
    (folder / "images").mkdir()
    Image.new("RGB", (8, 8), (255, 0, 0)).save(folder / "images" / "red.png")
    good = chat("<image>What colour?", "red", ["images/red.png"])
    data = folder / "data.jsonl"
    data.write_text("\n".join([good, good, bad_line]) + "\n")
    return data


def recipe_for(folder, data, extra: str = "", model: str = "tiny-vlm") -> str:
    path = folder / "recipe.toml"
    path.write_text(f'[model]\nname = "{model}"\n[dataset]\nname = "{data}"\n[method]\nkind = "lora"\n{extra}')
    return str(path)


def assert_refused(result, runs_dir, *needles):
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    for needle in needles:
        assert needle in result.stderr, result.stderr
    assert not runs_dir.exists() or not any(runs_dir.iterdir())


BAD_RECORDS = {
    "missing": (chat("<image>What colour?", "red", ["images/nothing.png"]), ["does not exist", "check the path"]),
    "unreadable": (chat("<image>What colour?", "red", ["images/broken.png"]), ["cannot be read as an image",
                                                                               "valid PNG"]),
    "placeholders": (chat("<image><image>Compare them.", "same", ["images/red.png"]),
                     ["2 '<image>' placeholder(s)", "1 image(s)", "one '<image>'"]),
    "url": (chat("<image>What colour?", "red", ["https://example.com/cat.png"]), ["is a URL", "download"]),
}


@pytest.mark.slow
@pytest.mark.parametrize("problem", sorted(BAD_RECORDS))
def test_bad_image_record_exits_2(tmp_path, problem):
    line, needles = BAD_RECORDS[problem]
    data = image_data(tmp_path, line)
    (tmp_path / "images" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really a png")
    runs = tmp_path / "runs"
    result = llmtui("run", recipe_for(tmp_path, data), runs_dir=runs, timeout=300)
    assert_refused(result, runs, "data.jsonl:3", *needles)


@pytest.mark.slow
def test_packing_refused_for_images(tmp_path):
    data = image_data(tmp_path, chat("<image>What colour?", "red", ["images/red.png"]))
    runs = tmp_path / "runs"
    result = llmtui("run", recipe_for(tmp_path, data, "[train]\npacking = true\n"), runs_dir=runs, timeout=300)
    assert_refused(result, runs, "train.packing", "train.packing = false")


@pytest.mark.slow
def test_text_model_refused_for_images(tmp_path):
    data = image_data(tmp_path, chat("<image>What colour?", "red", ["images/red.png"]))
    runs = tmp_path / "runs"
    result = llmtui("run", recipe_for(tmp_path, data, model="tiny"), runs_dir=runs, timeout=300)
    assert_refused(result, runs, "model.name", "'tiny' is not a vision-language model", "tiny-vlm")


def test_image_paths_resolve_against_the_data_file(tmp_path):
    data = image_data(tmp_path, chat("<image>What colour?", "red", ["images/red.png"]))
    records = load_records(DatasetSpec(name=str(data)))
    assert records[0]["images"] == [str((tmp_path / "images" / "red.png").resolve())]


def test_placeholders_without_images_are_refused(tmp_path):
    data = image_data(tmp_path, chat("<image>What colour?", "red", []))
    with pytest.raises(Exception, match="1 '<image>' placeholder"):
        inspect_dataset(DatasetSpec(name=str(data)))


def test_demo_shapes_is_drawn_once_and_deterministic():
    train = inspect_dataset(DatasetSpec(name="demo:shapes"), limit=3)
    heldout = load_records(DatasetSpec(name="demo:shapes-heldout"))
    assert train.count == demo_shapes.TRAIN_COUNT and train.with_images == train.count
    assert len(heldout) == demo_shapes.HELDOUT_COUNT
    assert demo_shapes.shapes_records() == demo_shapes.shapes_records()
    first = train.examples[0]
    assert first["messages"][0]["content"].startswith("<image>") and len(first["images"]) == 1
    with Image.open(first["images"][0]) as image:
        assert image.size == (demo_shapes.IMAGE_SIZE, demo_shapes.IMAGE_SIZE)
    answers = {r["messages"][1]["content"] for r in demo_shapes.shapes_records()}
    assert answers <= set(demo_shapes.COLOURS) | set(demo_shapes.SHAPES) | set(demo_shapes.COLUMNS) | {
        "one", "two", "three"}
    held_images = {p for r in heldout for p in r["images"]}
    assert not held_images & {p for r in load_records(DatasetSpec(name="demo:shapes")) for p in r["images"]}


@pytest.mark.slow
def test_a_record_over_max_seq_len_is_refused_naming_it(tmp_path):
    long = chat("<image>" + "Which colour is this picture, please? " * 4, "red", ["images/red.png"])
    data = image_data(tmp_path, long)
    runs = tmp_path / "runs"
    result = llmtui("run", recipe_for(tmp_path, data, "[train]\nmax_seq_len = 24\npacking = false\n"),
                    runs_dir=runs, timeout=300)
    assert_refused(result, runs, "train.max_seq_len", "record 3 of", "image tokens", "never cut",
                   "raise train.max_seq_len above", "drop the record")
