"""The bundled offline model: a ~1M-parameter Llama and a byte-level BPE tokenizer.

Both are made by this module, deterministically, from the demo corpora, so nothing is
downloaded. The architecture is `tuiapp.core.plan.estimate.TINY_CONFIG` (one definition for the
estimate and the model). The folder is built once per cache dir and definition, in a
temporary folder renamed into place, so several ranks may call `ensure_tiny_model` at once.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from tuiapp.core.common.built_folder import build_once, cache_root
from tuiapp.core.data import demo_data
from tuiapp.core.plan.estimate import TINY_CONFIG

# Bump when the build changes in a way the definition hash below cannot see.
TINY_VERSION = "2"
MARKER = "llmtui_tiny.json"
SEED = 0
EOS, PAD, IM_START, IM_END = "<|endoftext|>", "<|pad|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [EOS, PAD, IM_START, IM_END]

# ChatML. Assistant and tool_call turns sit inside {% generation %} so that
# apply_chat_template(..., return_assistant_tokens_mask=True) marks them, <|im_end|> included.
# A tool call is written as Qwen's: <tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>, from an
# assistant turn's tool_calls (TRL's tool loop) or from a "tool_call" turn whose content is that JSON (datasets);
# TRL parses it with its Qwen response template (trainer.methods.rl.tool_template). Tool results are a "tool" turn.
_TURNS = (
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- generation %}{{- message.content or '' }}"
    "{%- for call in message.tool_calls or [] %}"
    "{%- set f = call.function if call.function is defined else call %}"
    "{{- ('\\n' if message.content or not loop.first else '') + '<tool_call>\\n{\"name\": ' + (f.name | tojson)"
    " + ', \"arguments\": ' + (f.arguments if f.arguments is string else (f.arguments | tojson)) + '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>' }}{%- endgeneration %}"
    "{{- '\\n' }}"
    "{%- elif message.role == 'tool_call' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- generation %}{{- '<tool_call>\\n' + message.content + '\\n</tool_call><|im_end|>' }}"
    "{%- endgeneration %}"
    "{{- '\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# The `chatml` template of dataset.template: tools as their JSON schemas, as Qwen and Hermes show them.
CHATML_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n# Tools\\n' + (tools | tojson) + '<|im_end|>\\n' }}"
    "{%- endif %}" + _TURNS
)
# The bundled tiny model's: a tool as one line, `name(arguments): description` (its JSON schema would be
# ~220 of the tiny tokenizer's tokens in every prompt and every training example).
TINY_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n# Tools\\n' }}"
    "{%- for tool in tools %}{%- set f = tool.function if tool.function is defined else tool %}"
    "{{- f.name + '(' + ((f.parameters.properties if f.parameters is defined else {}) | list | join(', ')) + '): '"
    " + (f.description or '') + '\\n' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}" + _TURNS
)


def definition_version() -> str:
    """Changes whenever anything that shapes the built folder changes."""
    parts = [TINY_VERSION, SEED, SPECIAL_TOKENS, TINY_TEMPLATE, TINY_CONFIG, demo_data.DEMO_VERSION]
    return TINY_VERSION + "-" + hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:10]


def default_cache_dir() -> Path:
    return cache_root()


def ensure_tiny_model(cache_dir: Path | str | None = None) -> Path:
    """The tiny model's HF folder, built on first use."""
    target = Path(cache_dir or default_cache_dir()) / "models" / f"tiny-{definition_version()}"
    return build_once(target, _build, _is_complete)


def _is_complete(folder: Path) -> bool:
    try:
        return json.loads((folder / MARKER).read_text())["version"] == definition_version()
    except (OSError, ValueError, KeyError):
        return False


def _build(folder: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = build_tokenizer()
    shape = {k: v for k, v in TINY_CONFIG.items() if k not in ("architectures", "model_type")}
    # The vocab is padded up to TINY_CONFIG's size: the demo corpora hold fewer merges.
    if len(tokenizer) > shape["vocab_size"]:
        raise RuntimeError(f"the tokenizer has {len(tokenizer)} tokens, over TINY_CONFIG's vocab")
    config = LlamaConfig(
        **shape, bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):  # a fixed init that leaves the caller's RNG alone
        torch.manual_seed(SEED)
        model = LlamaForCausalLM(config)
    # generate() stops at the end of a chat turn as well as at the end of a document
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids(IM_END)]
    # every rank may build it (each into its own temp folder): write even off the main process
    model.save_pretrained(folder, is_main_process=True)  # safetensors
    tokenizer.save_pretrained(folder)
    if not (folder / "config.json").is_file() or not list(folder.glob("*.safetensors")):
        raise RuntimeError(f"saving the tiny model into {folder} wrote no weights")
    params = sum(p.numel() for p in model.parameters())
    marker = {"version": definition_version(), "parameters": params, "tokens": len(tokenizer)}
    (folder / MARKER).write_text(json.dumps(marker) + "\n")


def build_tokenizer():
    """A byte-level BPE trained on the demo corpora, with ChatML special tokens and template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = processors.ByteLevel(trim_offsets=False)  # exact char offsets
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_CONFIG["vocab_size"], special_tokens=SPECIAL_TOKENS, min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    backend.train_from_iterator(_corpus(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token=EOS, pad_token=PAD,
        extra_special_tokens=[IM_START, IM_END], chat_template=TINY_TEMPLATE,
        model_max_length=TINY_CONFIG["max_position_embeddings"],
    )


def _corpus() -> list[str]:
    texts = [r["text"] for r in demo_data.text_records()]
    texts += [f"{r['instruction']}\n{r['input']}\n{r['output']}" for r in demo_data.facts_records()]
    texts += [m["content"] for r in demo_data.chat_records() for m in r["messages"]]
    texts += ["system\nuser\nassistant\ntool\n# Tools\n<tool_call>\n</tool_call>\n"] * 50
    return texts
