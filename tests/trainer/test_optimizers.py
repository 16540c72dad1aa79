"""train.optimizer: each optimizer that runs here trains the tiny model through the real Trainer
(loss falls), and the estimate's optimizer bytes match its state after a real step."""

from pathlib import Path

import pytest

from tuiapp.core.config.recipe import parse_recipe
from tuiapp.core.plan import estimate

RUNS_HERE = ("adamw", "muon", "adafactor", "schedule_free_adamw", "lion")  # the others need CUDA
STEPS = 8


def _recipe(kind: str):
    return parse_recipe(f"""
[dataset]
name = "demo:text"
[method]
kind = "pretrain"
[train]
optimizer = "{kind}"
max_steps = {STEPS}
micro_batch = 4
learning_rate = 3e-3
max_seq_len = 32
warmup_ratio = 0.0
scheduler = "constant"
[launch]
gpus = 1
""", "optim.toml")


def _train(kind: str, tiny_model: Path, out: Path) -> tuple[list[float], int]:
    import transformers
    from transformers import TrainerCallback

    from tuiapp.trainer import optimizers
    from tuiapp.trainer.data import build_datasets, make_collator
    from tuiapp.trainer.model import apply_method, cache_dir, load_model, load_tokenizer
    from tuiapp.trainer.run import RunTrainer, _training_args

    recipe = _recipe(kind)
    tokenizer = load_tokenizer(str(tiny_model), False, recipe)
    train_set, _ = build_datasets(recipe, tokenizer, cache_dir())
    transformers.set_seed(0)
    model = apply_method(load_model(recipe, str(tiny_model), "fp32"), recipe, str(tiny_model))
    losses: list[float] = []

    class Losses(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                losses.append(float(logs["loss"]))

    args = _training_args(recipe, out, "fp32", has_eval=False)
    args.report_to = []
    trainer = RunTrainer(model=model, args=args, train_dataset=train_set,
                         data_collator=make_collator(recipe, tokenizer), processing_class=tokenizer,
                         callbacks=[Losses()])
    optimizers.install(trainer, recipe)
    trainer.train()
    return losses, optimizers.state_bytes(trainer.optimizer)


@pytest.fixture(scope="module")
def trained(tiny_model, tmp_path_factory):
    return {kind: _train(kind, tiny_model, tmp_path_factory.mktemp(kind)) for kind in RUNS_HERE}


@pytest.mark.slow
@pytest.mark.parametrize("kind", RUNS_HERE)
def test_optimizer_trains_and_its_state_is_estimated(kind, trained):
    losses, measured = trained[kind]
    assert len(losses) >= STEPS // 2
    first, last = sum(losses[:2]) / 2, sum(losses[-2:]) / 2
    assert last < first * 0.9, (kind, losses)
    predicted = estimate.estimate_recipe(_recipe(kind), dict(estimate.TINY_CONFIG), 1, cuda=False).memory.optimizer
    assert abs(predicted - measured) <= 0.05 * measured, (kind, predicted, measured)
