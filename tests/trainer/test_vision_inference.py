"""A vision-language model after training: the inference code shared by the chat server and `llmtui
eval` loads the real tiny VLM with its processor and answers about an image; a text model refuses
images; `llmtui data` names each example's images and can draw one in half-blocks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from tuiapp.core.after.targets import Target
from tuiapp.core.config.recipe import GenerateSpec
from tuiapp.trainer.tools import inference
from tuiapp.trainer.tools.preview import half_blocks

pytestmark = pytest.mark.tiny


def _picture(tmp_path: Path) -> str:
    path = tmp_path / "red.png"
    image = Image.new("RGB", (64, 64), (255, 255, 255))
    image.paste((220, 30, 30), (0, 0, 32, 64))
    image.save(path)
    return str(path)


def test_with_images_puts_a_placeholder_per_image_before_the_turn():
    turns, paths = inference.with_images([{"role": "user", "content": "Which colour?", "images": ["a.png", "b.png"]},
                                          {"role": "assistant", "content": "red"},
                                          {"role": "user", "content": "<image>And here?", "images": ["c.png"]}])
    assert [t["content"] for t in turns] == ["<image><image>Which colour?", "red", "<image>And here?"]
    assert paths == ["a.png", "b.png", "c.png"]
    turns, paths = inference.with_images([{"role": "user", "content": "<image>Which?"}], ["d.png"])
    assert turns[0]["content"] == "<image>Which?" and paths == ["d.png"]  # a record's own placeholders


def test_the_tiny_vlm_answers_about_an_image_through_its_processor(tmp_path):
    target = Target(run_dir=str(tmp_path), path=str(tmp_path), label="final", kind="full", method="sft",
                    base="tiny-vlm")
    loaded = inference.load("base", target)
    assert loaded.processor is not None and loaded.tokenizer is loaded.processor.tokenizer
    settings = GenerateSpec(max_new_tokens=4, temperature=0.0)
    image = _picture(tmp_path)
    pieces: list[str] = []
    done = inference.generate(loaded, [{"role": "user", "content": "Which colour?", "images": [image]}], settings,
                              pieces.append)
    assert 1 <= done["tokens"] <= 4 and done["prompt_tokens"] > 4  # the image's tokens are in the prompt
    again = inference.generate(loaded, [{"role": "user", "content": "<image>Which colour?"}], settings, images=[image])
    assert again["text"] == done["text"]  # a record's placeholder and its images apart: the same prompt
    with pytest.raises(ValueError, match="placeholder"):
        inference.generate(loaded, [{"role": "user", "content": "<image><image>Which?"}], settings, images=[image])
    with pytest.raises(ValueError, match="does not exist"):
        inference.generate(loaded, [{"role": "user", "content": "Which?", "images": [str(tmp_path / "no.png")]}],
                           settings)


def test_a_text_model_refuses_images(tmp_path, tiny_model):
    target = Target(run_dir=str(tmp_path), path=str(tmp_path), label="final", kind="full", method="sft", base="tiny")
    loaded = inference.load("base", target)
    assert loaded.processor is None
    with pytest.raises(ValueError, match="reads text only"):
        inference.generate(loaded, [{"role": "user", "content": "Hi", "images": [_picture(tmp_path)]}],
                           GenerateSpec(max_new_tokens=2))


def test_half_blocks_draw_the_upper_pixel_over_the_lower(tmp_path):
    path = tmp_path / "rows.png"
    image = Image.new("RGB", (4, 4), (255, 255, 255))
    image.paste((220, 30, 30), (0, 0, 4, 1))  # the top row red, the next blue, two white
    image.paste((30, 70, 220), (0, 1, 4, 2))
    image.save(path)
    lines = half_blocks(str(path), width=4).splitlines()
    assert len(lines) == 2 and all(line.count("▀") == 4 for line in lines)  # a square picture: 4 wide, 2 lines
    assert lines[0] == "\x1b[38;2;220;30;30m\x1b[48;2;30;70;220m▀" * 4 + "\x1b[0m"  # red over blue
    assert lines[1] == "\x1b[38;2;255;255;255m\x1b[48;2;255;255;255m▀" * 4 + "\x1b[0m"


def test_llmtui_data_names_each_examples_images_as_the_collator_sees_them(capfd):
    from tuiapp.trainer.tools import preview

    recipe = str(Path(__file__).resolve().parents[2] / "recipes" / "tiny-vlm-lora.toml")
    assert preview.main([recipe, "--show", "1"]) == 0
    out = capfd.readouterr().out
    assert "── example 0: 38 tokens, 4 trained" in out
    assert "train-0000.png (64x64 PNG)" in out and "\x1b[" not in out  # no picture outside a terminal
    assert "⟦<|im_start|>user" in out and "<image_soft_token>" in out and "⟧two<|im_end|>" in out
    assert preview.main([recipe, "--show", "2", "--json"]) == 0
    examples = json.loads(capfd.readouterr().out)
    assert [e["images"][0]["width"] for e in examples] == [64, 64]
    assert all(e["images"][0]["path"].endswith(".png") and e["images"][0]["format"] == "PNG" for e in examples)


def test_the_runs_max_pixels_reach_the_processor(tmp_path, monkeypatch):
    recipe = 'name = "x"\n[model]\nname = "tiny-vlm"\n[method]\nkind = "lora"\n[vision]\nmax_pixels = 4096\n'
    (tmp_path / "recipe.toml").write_text(recipe)
    target = Target(run_dir=str(tmp_path), path=str(tmp_path), label="final", kind="full", method="sft",
                    base="tiny-vlm")
    assert inference._max_pixels(target) == 4096
    assert inference._max_pixels(Target(run_dir=str(tmp_path / "none"), path="", label="final", kind="full",
                                        method="sft", base="tiny-vlm")) == 0  # no recipe: the processor's own
    seen = []
    monkeypatch.setattr(inference.vision, "apply_max_pixels", lambda processor, pixels: seen.append(pixels))
    inference.load("base", target)
    assert seen == [4096]
