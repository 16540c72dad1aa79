"""dataset.template: every chat template trains exactly the assistant's answers and their end of turn."""

import pytest
from transformers import AutoTokenizer

from tuiapp.core.common.errors import RecipeError
from tuiapp.core.config.recipe import CHAT_TEMPLATES
from tuiapp.trainer.dataset import data
from tuiapp.trainer.dataset.data import IGNORE
from tuiapp.trainer.models import templates

pytestmark = pytest.mark.tiny

CONVERSATION = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "Capital of Japan?"},
    {"role": "assistant", "content": "Tokyo."},
    {"role": "user", "content": "And of France?"},
    {"role": "assistant", "content": "Paris."},
]


def _spans(example: dict) -> list[list[int]]:
    spans, current = [], []
    for token, label in zip(example["input_ids"], example["labels"], strict=True):
        if label != IGNORE:
            current.append(token)
        elif current:
            spans.append(current)
            current = []
    return spans + ([current] if current else [])


@pytest.fixture
def tokenizer(tiny_model):
    return AutoTokenizer.from_pretrained(tiny_model)


@pytest.mark.parametrize("name", [t for t in CHAT_TEMPLATES if t != "model"])
def test_each_template_trains_the_answers_and_their_end_of_turn_only(tokenizer, name):
    templates.apply_template(tokenizer, name)
    example = data._chat_example(CONVERSATION, None, tokenizer, 1024)
    trained = [tokenizer.decode(span) for span in _spans(example)]
    end = templates.END_OF_TURN[name]
    assert trained == [f"Tokyo.{end}", f"Paris.{end}"]
    whole = tokenizer.decode(example["input_ids"])
    assert "Answer briefly." in whole and "Capital of Japan?" in whole  # the prompt is there, untrained


@pytest.mark.parametrize("name", ["llama3", "gemma", "phi"])
def test_templates_render_the_generation_prompt_and_tools(tokenizer, name):
    templates.apply_template(tokenizer, name)
    text = tokenizer.apply_chat_template(CONVERSATION[:2], tokenize=False, add_generation_prompt=True,
                                         tools=[{"name": "weather"}])
    opening = templates.TURNS[name].assistant[0]
    assert text.endswith(opening)
    assert '"name": "weather"' in text


def test_model_template_is_required_when_the_tokenizer_has_none(tokenizer):
    tokenizer.chat_template = None
    with pytest.raises(RecipeError) as raised:
        templates.apply_template(tokenizer, "model", "base-model")
    assert raised.value.key == "dataset.template" and "chatml" in raised.value.fix
    templates.apply_template(tokenizer, "gemma")
    assert "<start_of_turn>model" in tokenizer.chat_template


def test_pad_equal_to_eos_still_trains_the_answers_eos(tokenizer):
    """A tokenizer whose pad is its EOS: the collator masks padding by position, never the answer's EOS."""
    tokenizer.pad_token = tokenizer.eos_token
    templates.apply_template(tokenizer, "mistral")  # ends answers with </s>, here a plain string
    example = data._chat_example(CONVERSATION[1:3] + [{"role": "user", "content": "x"}], None, tokenizer, 1024)
    chat = [dict(example)]
    from tuiapp.core.config.recipe import Recipe

    recipe = Recipe.model_validate({"method": {"kind": "sft"}, "train": {"packing": False}})
    batch = data.make_collator(recipe, tokenizer)(chat + [{"input_ids": example["input_ids"][:3],
                                                            "labels": example["labels"][:3],
                                                            "attention_mask": [1, 1, 1]}])
    trained = batch["labels"][0][batch["labels"][0] != IGNORE].tolist()
    assert tokenizer.decode(trained) == "Tokyo.</s>"
    assert (batch["labels"][1][3:] == IGNORE).all()  # padding of the short row is never trained
