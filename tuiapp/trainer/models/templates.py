"""Chat templates for `dataset.template`: for base models without one, or to train another format.

Each is Jinja as transformers renders it, with the assistant's answer and its end-of-turn inside
{% generation %}, so the label mask (apply_chat_template's assistant mask) is exact. Tools go in a
system-like turn as JSON. The chosen template is set on the tokenizer, so it is saved with the
trained model and chat and export use the same format.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from tuiapp.core.common.errors import RecipeError
from tuiapp.trainer.models.tiny import CHATML_TEMPLATE


@dataclass(frozen=True)
class Turns:
    """Opening and closing text of each role's turn; `other` opens any other role ({role} filled in)."""

    system: tuple[str, str]
    user: tuple[str, str]
    assistant: tuple[str, str, str]  # open, trained close (end of turn), untrained text after it
    other: tuple[str, str]
    bos: bool = False  # start with the tokenizer's bos_token when it has one


def _lit(text: str) -> str:
    return json.dumps(text)  # a JSON string is a Jinja string literal


def render_template(t: Turns) -> str:
    a_open, a_close, a_after = (_lit(x) for x in t.assistant)
    other_open = _lit(t.other[0]).replace("{role}", '" + message.role + "')
    out = []
    if t.bos:
        out.append("{%- if bos_token %}{{- bos_token }}{%- endif %}")
    out.append("{%- if tools %}{{- " + _lit(t.system[0]) + " + 'Tools:\\n' + (tools | tojson) + "
               + _lit(t.system[1]) + " }}{%- endif %}")
    out.append("{%- for message in messages %}")
    out.append("{%- if message.role == 'assistant' %}{{- " + a_open + " }}{%- generation %}{{- message.content + "
               + a_close + " }}{%- endgeneration %}{{- " + a_after + " }}")
    out.append("{%- elif message.role == 'system' %}{{- " + _lit(t.system[0]) + " + message.content + "
               + _lit(t.system[1]) + " }}")
    out.append("{%- elif message.role == 'user' %}{{- " + _lit(t.user[0]) + " + message.content + "
               + _lit(t.user[1]) + " }}")
    out.append("{%- else %}{{- " + other_open + " + message.content + " + _lit(t.other[1]) + " }}")
    out.append("{%- endif %}{%- endfor %}")
    out.append("{%- if add_generation_prompt %}{{- " + a_open + " }}{%- endif %}")
    return "".join(out)


_LLAMA3 = "<|start_header_id|>{role}<|end_header_id|>\n\n"
TURNS: dict[str, Turns] = {
    "llama3": Turns(system=(_LLAMA3.format(role="system"), "<|eot_id|>"),
                    user=(_LLAMA3.format(role="user"), "<|eot_id|>"),
                    assistant=(_LLAMA3.format(role="assistant"), "<|eot_id|>", ""),
                    other=(_LLAMA3, "<|eot_id|>"), bos=True),
    "gemma": Turns(system=("<start_of_turn>user\n", "<end_of_turn>\n"),  # Gemma has no system role
                   user=("<start_of_turn>user\n", "<end_of_turn>\n"),
                   assistant=("<start_of_turn>model\n", "<end_of_turn>", "\n"),
                   other=("<start_of_turn>{role}\n", "<end_of_turn>\n"), bos=True),
    "mistral": Turns(system=("[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]"), user=("[INST]", "[/INST]"),
                     assistant=("", "</s>", ""), other=("[INST]{role}: ", "[/INST]"), bos=True),
    "phi": Turns(system=("<|system|>\n", "<|end|>\n"), user=("<|user|>\n", "<|end|>\n"),
                 assistant=("<|assistant|>\n", "<|end|>", "\n"), other=("<|{role}|>\n", "<|end|>\n")),
}
# the end-of-turn text of each template: generation stops there
END_OF_TURN = {"chatml": "<|im_end|>", "qwen": "<|im_end|>", **{k: v.assistant[1] for k, v in TURNS.items()}}


def template_text(name: str) -> str:
    if name in ("chatml", "qwen"):  # Qwen's chat format is ChatML
        return CHATML_TEMPLATE
    return render_template(TURNS[name])


def apply_template(tokenizer, name: str, model_label: str = "the model") -> None:
    """Set dataset.template on the tokenizer; 'model' keeps its own, which must exist."""
    if name == "model":
        if not getattr(tokenizer, "chat_template", None):
            raise RecipeError(message=f"the tokenizer of {model_label} has no chat template",
                              key="dataset.template",
                              fix="set dataset.template = 'chatml' (or llama3, qwen, gemma, mistral, phi)")
        return
    tokenizer.chat_template = template_text(name)
