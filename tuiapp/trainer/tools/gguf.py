"""The tokenizer side of shipping a model: its chat template as a Modelfile's pieces
(tuiapp.core.after.modelfile), rendered exactly as training rendered it."""

from __future__ import annotations

from tuiapp.core.after.modelfile import ChatFormat, derive
from tuiapp.trainer.dataset.data import _render, _template_messages


def special_tokens(tokenizer) -> list[str]:
    found = set(getattr(tokenizer, "all_special_tokens", []) or [])
    for token in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
        if getattr(token, "special", False):
            found.add(str(token.content))
    return sorted(found)


def chat_format(tokenizer) -> ChatFormat:
    """The pieces of the tokenizer's chat template (ChatML when it has none, as in training)."""

    def render(messages: list, add_generation_prompt: bool) -> str:
        return _render(tokenizer, _template_messages(messages, tokenizer), tokenize=False,
                       add_generation_prompt=add_generation_prompt)

    return derive(render, tokenizer.bos_token, tokenizer.eos_token, special_tokens(tokenizer))
