"""No host sync per training step: loss, grad-norm and metrics are read once per logging step.

A real Trainer (RunTrainer, the run's own training arguments and callbacks) trains the tiny model on
packed SFT batches on the CPU, and every read of a tensor's value on the host (`.item()`,
`.tolist()`, `float()`, `int()`, `bool()` of a tensor: each one waits for the device on a GPU)
made by the training loop or llmtui's callbacks is counted per step. Steps that do not log make none;
a logging step makes a few (the loss, the grad norm, the learning rate, memory)."""

from __future__ import annotations

import socket
import traceback

import pytest
import torch
from transformers import TrainerCallback

from tests.trainer.test_trained_logits import sft_recipe
from tuiapp.core.plan.model_profile import TORCH_VARLEN
from tuiapp.trainer.dataset.data import build_datasets, make_collator
from tuiapp.trainer.loop.callbacks import GracefulStop, RunRecorder
from tuiapp.trainer.models.model import load_model, load_tokenizer
from tuiapp.trainer.run import RunTrainer, training_kwargs

pytestmark = pytest.mark.slow  # a real Trainer's 9 steps: ~20 s on 2 shared cores

READS = ("item", "tolist", "__float__", "__int__", "__bool__")
CPU_ONLY = {  # (file, function): reads on branches that run only without CUDA, where they wait for nothing
    ("torch_varlen.py", "packed_attention"),  # the fallback, sdpa per example; the kernel takes a tensor
    ("callbacks.py", "<listcomp>"),  # GracefulStop._ready_counts on CPU; on CUDA: staged to pinned memory
}
LOGGING_STEPS = 4
STEPS = 9


class StepReads(TrainerCallback):
    """The host reads counted between one step's start and the next, with where they came from."""

    def __init__(self):
        self.step, self.reads = 0, {}

    def on_step_begin(self, args, state, control, **kwargs):
        self.step = state.global_step + 1

    def note(self, name):
        frames = [f for f in traceback.extract_stack()[:-2] if "/torch/" not in f.filename
                  or "/optim/" in f.filename]
        last = frames[-1] if frames else None
        if last is None or (last.filename.rsplit("/", 1)[-1], last.name) in CPU_ONLY:
            return
        where = f"{last.filename.rsplit('/', 1)[-1]}:{last.name}:{last.lineno}"
        self.reads.setdefault(self.step, []).append(f"{name} at {where}")


@pytest.fixture(scope="module")
def step_reads(tiny_model, llmtui_cache, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("syncs")
    recipe = sft_recipe(tiny_model, kind="sft")
    recipe.train.logging_steps, recipe.train.max_steps, recipe.train.micro_batch = LOGGING_STEPS, STEPS, 2
    tokenizer = load_tokenizer(str(tiny_model), False, recipe)
    train_set, _ = build_datasets(recipe, tokenizer, llmtui_cache)
    torch.manual_seed(0)
    model = load_model(recipe, str(tiny_model), "fp32")
    model.config._attn_implementation = TORCH_VARLEN  # as 'auto' runs packed batches on CUDA (its CPU fallback)
    stopper = GracefulStop()
    counter = StepReads()
    trainer = RunTrainer(model=model, args=__import__("transformers").TrainingArguments(
        **training_kwargs(recipe, run_dir, "fp32", False)), train_dataset=train_set,
        data_collator=make_collator(recipe, tokenizer, varlen_attention=True), processing_class=tokenizer,
        callbacks=[stopper, RunRecorder(run_dir, socket.gethostname(), agreement=stopper), counter])
    trainer.step_agreement = stopper
    originals = {name: getattr(torch.Tensor, name) for name in READS}

    def counted(name):
        def read(self, *args, **kwargs):
            if counter.step:
                counter.note(name)
            return originals[name](self, *args, **kwargs)
        return read

    try:
        for name in READS:
            setattr(torch.Tensor, name, counted(name))
        trainer.train()
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)
    return counter.reads


def test_steps_that_do_not_log_read_nothing_on_the_host(step_reads):
    quiet = {step: reads for step, reads in step_reads.items()
             if step % LOGGING_STEPS and step not in (1, STEPS)}  # the first and last steps log
    assert quiet == {}, __import__('json').dumps(quiet, indent=1)


def test_a_logging_step_reads_a_few_values(step_reads):
    assert 0 < len(step_reads.get(LOGGING_STEPS, [])) <= 8, step_reads.get(LOGGING_STEPS)
