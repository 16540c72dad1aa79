"""The vision side of training: the tiny VLMs of two families build offline and take a training step,
the collator's labels keep only the answers (image tokens and prompts -100), the vision tower is frozen."""

from __future__ import annotations

import json

import pytest
import torch
from PIL import Image

from tuiapp.core.common.errors import DatasetError
from tuiapp.core.config.recipe import Recipe
from tuiapp.trainer.models import vision
from tuiapp.trainer.models.tiny import IM_END

IMAGE_CHATS = [
    {"messages": [{"role": "user", "content": "<image>What colour is it?"}, {"role": "assistant", "content": "red"}]},
    {"messages": [{"role": "system", "content": "Be brief."},
                  {"role": "user", "content": "Compare <image> and <image>."},
                  {"role": "assistant", "content": "same shape"},
                  {"role": "user", "content": "And the count?"},
                  {"role": "assistant", "content": "two"}]},
]


def test_answer_labels_keep_the_answers_only():
    start, end, image = [7, 8], 9, 5
    ids = torch.tensor([[1, 5, 5, 2, 7, 8, 3, 4, 9, 1, 7, 8, 6, 9, 0]])
    labels = vision.answer_labels(ids, start, end, {image})
    assert labels.tolist() == [[-100] * 6 + [3, 4, 9] + [-100] * 3 + [6, 9, -100]]


def test_image_parts_follow_the_placeholders():
    assert vision.image_parts("Compare <image> and <image>.") == [
        {"type": "text", "text": "Compare "}, {"type": "image"}, {"type": "text", "text": " and "},
        {"type": "image"}, {"type": "text", "text": "."}]


def _features(tmp_path) -> list[dict]:
    paths = []
    for index, colour in enumerate([(255, 0, 0), (0, 0, 255)]):
        path = tmp_path / f"{index}.png"
        Image.new("RGB", (20, 12), colour).save(path)
        paths.append(str(path))
    counts = [1, 2]
    return [{"messages": json.dumps(chat["messages"]), "images": paths[:count]}
            for chat, count in zip(IMAGE_CHATS, counts, strict=True)]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(vision.TINY_VLMS))
def test_tiny_vlm_masks_prompts_and_images_and_trains(name, tmp_path, llmtui_cache):
    folder = vision.ensure_tiny_vlm(name)
    assert vision.is_vision_model(str(folder))
    processor = vision.load_processor(str(folder))
    batch = vision.VisionCollator(processor)(_features(tmp_path))
    tokenizer = processor.tokenizer
    trained = [tokenizer.decode(ids[labels != -100]) for ids, labels in zip(batch["input_ids"], batch["labels"],
                                                                            strict=True)]
    assert trained == [f"red{IM_END}", f"same shape{IM_END}two{IM_END}"]
    image_ids = vision.image_token_ids(processor)
    assert image_ids and all((batch["input_ids"] == token).any() for token in image_ids)
    assert not any((batch["labels"] == token).any() for token in image_ids)

    recipe = Recipe.model_validate({"model": {"name": name}, "method": {"kind": "lora", "rank": 4}})
    model = vision.apply_vision_method(vision.load_vision_model(recipe, str(folder), "fp32"), recipe)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n and ("language_model" in n or "lm_head" in n) for n in trainable)
    assert any("lm_head" in n for n in trainable) and any("language_model" in n for n in trainable)
    loss = model(**batch).loss
    loss.backward()
    assert torch.isfinite(loss)


@pytest.mark.slow
def test_full_fine_tune_freezes_the_vision_tower(llmtui_cache):
    folder = vision.ensure_tiny_vlm("tiny-llava")
    recipe = Recipe.model_validate({"model": {"name": "tiny-llava"}, "method": {"kind": "sft"}})
    model = vision.apply_vision_method(vision.load_vision_model(recipe, str(folder), "fp32"), recipe)
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert frozen and all("vision_tower" in n for n in frozen)
    assert any("multi_modal_projector" in n for n, p in model.named_parameters() if p.requires_grad)


@pytest.mark.slow
def test_a_record_over_max_seq_len_is_an_error(llmtui_cache):
    recipe = Recipe.model_validate({"model": {"name": "tiny-vlm"}, "dataset": {"name": "demo:shapes"},
                                    "method": {"kind": "lora"}, "train": {"max_seq_len": 16, "packing": False}})
    with pytest.raises(DatasetError, match=r"record 1 \(and \d+ more of the first 1000\): \d+ tokens with its images, "
                       r"over train.max_seq_len \(16\)"):
        vision.vision_datasets(recipe)
    fits = recipe.model_copy(update={"train": recipe.train.model_copy(update={"max_seq_len": 128})})
    train, held_out = vision.vision_datasets(fits)
    assert len(train) == 600 and held_out is None and json.loads(train[0]["messages"])[0]["role"] == "user"


GEMMA_STYLE = (  # Gemma 3's turn layout: <start_of_turn>user / model ... <end_of_turn>
    "{%- for message in messages %}{{- '<start_of_turn>' + ('model' if message.role == 'assistant' else message.role)"
    " + '\\n' }}{%- for part in message.content %}{%- if part.type == 'image' %}{{- '" + vision.IMAGE_TOKENS["gemma3"][0]
    + "' }}{%- else %}{{- part.text }}{%- endif %}{%- endfor %}{{- '<end_of_turn>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<start_of_turn>model\\n' }}{%- endif %}")


@pytest.mark.slow
def test_the_answer_mask_follows_the_models_own_template(tmp_path, llmtui_cache):
    """Not only ChatML: the assistant turn's opener and end come from the processor's template, so a
    Gemma-style template trains on the answers, and a template whose turns cannot be found is an
    error, never a silent run on no token."""
    processor = vision.load_processor(str(vision.ensure_tiny_vlm("tiny-vlm")))
    processor.tokenizer.add_special_tokens({"additional_special_tokens": ["<start_of_turn>", "<end_of_turn>"]})
    processor.chat_template = GEMMA_STYLE
    start, end = vision.answer_markers(processor)
    tokenizer = processor.tokenizer
    assert tokenizer.decode(start) == "<start_of_turn>model\n" and tokenizer.convert_ids_to_tokens(end) == "<end_of_turn>"
    batch = vision.VisionCollator(processor)(_features(tmp_path))
    trained = [tokenizer.decode(ids[labels != -100]) for ids, labels in zip(batch["input_ids"], batch["labels"],
                                                                            strict=True)]
    assert trained == ["red<end_of_turn>", "same shape<end_of_turn>two<end_of_turn>"]
    collator = vision.VisionCollator(processor)
    collator.answer_start = tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False)  # not in this text
    with pytest.raises(ValueError, match="no answer token found"):
        collator(_features(tmp_path))
