"""The Modelfile writer on real tokenizers: the bundled tiny one (ChatML) and chat templates in the
style of Qwen 2.5 (a default system prompt), Llama 3 (bos, header tokens) and Gemma (no system
turn: the system prompt folds into the first user turn), each rendered by transformers'
apply_chat_template. The derived pieces must rebuild what the template renders."""

from __future__ import annotations

import re

import pytest

from tuiapp.core.after.modelfile import ChatTemplateError, derive, go_template, modelfile, render_format

pytestmark = pytest.mark.tiny

QWEN = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are Qwen, a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role != 'system' %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
LLAMA3 = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim"
    " + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
GEMMA = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if message['role'] == 'assistant' -%}{%- set role = 'model' -%}{%- else -%}{%- set role = message['role'] -%}"
    "{%- endif -%}"
    "{{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else '') + message['content'] | trim"
    " + '<end_of_turn>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}"
)
GEMMA2_NO_SYSTEM = (
    "{{ bos_token }}"
    "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
    "{% for message in messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}"
)
# turns numbered by position: no fixed pieces, so refused
ROUNDS = (
    "{%- for message in messages %}"
    "{{- 'Round ' ~ loop.index ~ ' ' ~ message.role ~ ': ' ~ message.content ~ '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- 'assistant: ' }}{%- endif %}"
)


def _tokenizer(tiny_model, template: str | None = None, specials=(), bos: str | None = None):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model))
    if specials:
        tokenizer.add_special_tokens({"additional_special_tokens": list(specials)})
    if bos:
        tokenizer.add_special_tokens({"bos_token": bos})
    if template:
        tokenizer.chat_template = template
    return tokenizer


def _derive(tokenizer):
    from tuiapp.trainer.tools.gguf import chat_format

    return chat_format(tokenizer)


CONVERSATIONS = [
    [{"role": "user", "content": "Hi there"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"},
     {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3+3?"}],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"},
     {"role": "assistant", "content": "d"}],
]


def _rebuilds(tokenizer, fmt, conversations=CONVERSATIONS):
    for messages in conversations:
        for gen in (False, True):
            expected = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
            assert render_format(fmt, messages, gen) == expected


def test_tiny_chatml(tiny_model):
    tokenizer = _tokenizer(tiny_model)
    fmt = _derive(tokenizer)
    assert (fmt.upre, fmt.upost, fmt.apre, fmt.apost) == ("<|im_start|>user\n", "<|im_end|>\n",
                                                          "<|im_start|>assistant\n", "<|im_end|>\n")
    assert fmt.gen == "<|im_start|>assistant\n" and fmt.system_mode == "turn" and fmt.default_system is None
    assert fmt.stops == ["<|im_end|>", "<|im_start|>", "<|endoftext|>"]
    _rebuilds(tokenizer, fmt)
    text = modelfile("./model-q8_0.gguf", fmt, {"temperature": 0.0, "top_p": 1.0, "max_new_tokens": 64,
                                                "repetition_penalty": 1.1, "system": "You are terse."})
    assert text.startswith("FROM ./model-q8_0.gguf\nTEMPLATE \"\"\"")
    assert 'SYSTEM """You are terse."""' in text
    assert 'PARAMETER stop "<|im_end|>"\nPARAMETER stop "<|im_start|>"\nPARAMETER stop "<|endoftext|>"' in text
    assert "PARAMETER temperature 0\nPARAMETER top_p 1\nPARAMETER repeat_penalty 1.1\nPARAMETER num_predict 64" in text
    template = go_template(fmt)
    assert "{{ if .System }}<|im_start|>system\n{{ .System }}<|im_end|>\n{{ end }}" in template
    assert '{{ if eq .Role "user" }}<|im_start|>user\n{{ .Content }}<|im_end|>\n' \
           '{{ if $last }}<|im_start|>assistant\n{{ end }}' in template


def test_qwen_style_default_system(tiny_model):
    tokenizer = _tokenizer(tiny_model, QWEN)
    fmt = _derive(tokenizer)
    assert fmt.system_mode == "turn" and fmt.default_system == "You are Qwen, a helpful assistant."
    _rebuilds(tokenizer, fmt)
    text = modelfile("./m.gguf", fmt)
    assert 'SYSTEM """You are Qwen, a helpful assistant."""' in text
    assert "{{ if .System }}" not in go_template(fmt)  # the system block is always there, as in the template


def test_llama3_style(tiny_model):
    specials = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    tokenizer = _tokenizer(tiny_model, LLAMA3, specials, bos="<|begin_of_text|>")
    fmt = _derive(tokenizer)
    assert fmt.bos == "<|begin_of_text|>"
    assert fmt.upre == "<|start_header_id|>user<|end_header_id|>\n\n" and fmt.apost == "<|eot_id|>"
    assert fmt.spre == "<|start_header_id|>system<|end_header_id|>\n\n" and fmt.spost == "<|eot_id|>"
    assert fmt.stops[:2] == ["<|eot_id|>", "<|start_header_id|>"]
    _rebuilds(tokenizer, fmt)
    template = go_template(fmt)
    assert "<|begin_of_text|>" not in template  # llama.cpp adds the bos itself
    assert "<|begin_of_text|>" in go_template(fmt, include_bos=True)


def test_gemma_style_folds_the_system_prompt(tiny_model):
    specials = ["<bos>", "<start_of_turn>", "<end_of_turn>"]
    tokenizer = _tokenizer(tiny_model, GEMMA, specials, bos="<bos>")
    fmt = _derive(tokenizer)
    assert fmt.system_mode == "fold" and fmt.fold_sep == "\n\n"
    assert fmt.apre == "<start_of_turn>model\n" and fmt.apost == "<end_of_turn>\n"
    assert fmt.stops[:2] == ["<end_of_turn>", "<start_of_turn>"]
    _rebuilds(tokenizer, fmt)
    template = go_template(fmt)
    assert "{{ if and $first $.System }}{{ $.System }}\n\n{{ end }}" in template


def test_gemma2_without_system_role(tiny_model):
    tokenizer = _tokenizer(tiny_model, GEMMA2_NO_SYSTEM, ["<bos>", "<start_of_turn>", "<end_of_turn>"], bos="<bos>")
    fmt = _derive(tokenizer)
    assert fmt.system_mode == "none"
    _rebuilds(tokenizer, fmt, [c for c in CONVERSATIONS if c[0]["role"] != "system"])
    assert "SYSTEM" not in modelfile("./m.gguf", fmt, {"system": "ignored: the template has no system turn"})


def test_a_template_that_numbers_turns_is_refused(tiny_model):
    tokenizer = _tokenizer(tiny_model, ROUNDS)
    with pytest.raises(ChatTemplateError):
        _derive(tokenizer)


def test_go_template_escapes_braces():
    from tuiapp.core.after.modelfile import ChatFormat

    fmt = ChatFormat(upre="{{user}}: ", upost="\n", apre="bot: ", apost="\n", gen="bot: ")
    template = go_template(fmt)
    assert '{{ "{{" }}user}}: ' in template
    assert not re.search(r"\{\{-", template)  # no trimming: every literal newline stays
    assert derive(lambda m, g: render_format(fmt, m, g)).upre == "{{user}}: "


@pytest.mark.parametrize("name", ["chatml", "llama3", "gemma", "mistral", "phi"])
def test_every_dataset_template_derives(tiny_model, name):
    """The templates `dataset.template` trains with: each rebuilds, and its turn's end is a stop
    (as text when the tokenizer has no such special token)."""
    from tuiapp.trainer.models import templates

    tokenizer = _tokenizer(tiny_model)
    templates.apply_template(tokenizer, name)
    fmt = _derive(tokenizer)
    _rebuilds(tokenizer, fmt, [c for c in CONVERSATIONS if fmt.system_mode != "none" or c[0]["role"] != "system"])
    assert fmt.stops[0] == templates.END_OF_TURN[name] and fmt.stops[-1] == "<|endoftext|>"
