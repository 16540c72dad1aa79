"""A test plugin for the trainer's child processes (LLMTUI_TRAINER_PLUGINS=tests.plugins.broken_backward):
LoRA's models raise in their first backward, as a method broken by a library upgrade would. The dry
step before launch must catch it with this message."""

from tuiapp.trainer import run
from tuiapp.trainer.methods import adapters

MESSAGE = "lora's backward is broken on purpose (tests.plugins.broken_backward)"
_apply_method = adapters.apply_method


def _raise(module, grad_input, grad_output):
    raise RuntimeError(MESSAGE)


def apply_method(base, recipe, tokenizer_path):
    wrapped = _apply_method(base, recipe, tokenizer_path)
    if recipe.method.kind == "lora":
        base.get_output_embeddings().register_full_backward_hook(_raise)
    return wrapped


adapters.apply_method = run.apply_method = apply_method
