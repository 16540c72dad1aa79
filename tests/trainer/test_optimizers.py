"""train.optimizer: each optimizer that runs here trains the tiny model through the real Trainer
(loss falls), and the estimate's optimizer bytes match its state after a real step."""

from pathlib import Path

import pytest

from tuiapp.core.config.recipe import parse_recipe
from tuiapp.core.machine.gpus import cuda_available
from tuiapp.core.plan import estimate

RUNS_HERE = ("adamw", "muon", "adafactor", "schedule_free_adamw", "lion")
CUDA_ONLY = ("adamw_8bit", "galore", "apollo")  # refused before launch without CUDA (test_refused_...)
STEPS = 8


def _recipe(kind: str, cuda: bool = False):
    # on a GPU: one process under the ddp strategy (galore and apollo refuse DeepSpeed's flat
    # partitions), fp32 weights, so the optimizer's state is all the estimate's optimizer row holds
    launch = 'strategy = "ddp"\n' if cuda else ""
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
precision = "fp32"
[launch]
gpus = 1
{launch}""", "optim.toml")


def _train(kind: str, tiny_model: Path, out: Path, cuda: bool = False) -> tuple[list[float], int]:
    import transformers
    from transformers import TrainerCallback

    from tuiapp.trainer.dataset.data import build_datasets, make_collator
    from tuiapp.trainer.loop import optimizers
    from tuiapp.trainer.methods.adapters import apply_method
    from tuiapp.trainer.models.model import cache_dir, load_model, load_tokenizer
    from tuiapp.trainer.run import RunTrainer, _training_args

    recipe = _recipe(kind, cuda)
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


@pytest.mark.slow
@pytest.mark.skipif(not cuda_available(), reason="adamw_8bit, galore and apollo run on CUDA only")
@pytest.mark.parametrize("kind", CUDA_ONLY)
def test_cuda_optimizer_trains_and_its_state_is_estimated(kind, tiny_model, tmp_path):
    """The same on a GPU for the kinds that need one (with their packages: llmtui[qlora], [galore],
    [apollo]): the loss falls and the estimate's optimizer bytes are the state's within 5 %."""
    losses, measured = _train(kind, tiny_model, tmp_path, cuda=True)
    assert len(losses) >= STEPS // 2
    first, last = sum(losses[:2]) / 2, sum(losses[-2:]) / 2
    assert last < first * 0.9, (kind, losses)
    predicted = estimate.estimate_recipe(_recipe(kind, True), dict(estimate.TINY_CONFIG), 1, cuda=True).memory.optimizer
    assert abs(predicted - measured) <= 0.05 * measured, (kind, predicted, measured)


def test_state_bytes_counts_each_tensor_once_and_what_a_projector_holds():
    import torch

    from tuiapp.trainer.loop.optimizers import state_bytes

    class Projector:  # as GaLore's: the projection matrix on an object in the state
        def __init__(self):
            self.ortho_matrix, self.rank = torch.zeros(16, 4), 4

    shared = torch.zeros(256)  # as bitsandbytes' quantization map, one tensor in every parameter's state
    a, b = torch.nn.Parameter(torch.zeros(8, 16)), torch.nn.Parameter(torch.zeros(16))
    optimizer = torch.optim.SGD([a, b], lr=0.1)
    optimizer.state[a] = {"exp_avg": torch.zeros(8, 4), "qmap": shared, "projector": Projector(), "step": 3}
    optimizer.state[b] = {"exp_avg": torch.zeros(16, dtype=torch.uint8), "qmap": shared}
    assert state_bytes(optimizer) == 4 * 32 + 4 * 256 + 4 * 64 + 16


# ---------------------------------------------------------------- fast: schema, estimate, refusals


def _with(text: str):
    return parse_recipe("[method]\nkind = \"sft\"\n" + text, "x.toml")


def test_a_word_or_a_table_and_written_back_short():
    from tuiapp.core.common.errors import RecipeError

    assert _with("[train]\noptimizer = \"muon\"\n").train.optimizer.kind == "muon"
    assert _with("").train.optimizer.kind == "adamw"
    recipe = _with("[train.optimizer]\nkind = \"lion\"\nbetas = [0.9, 0.99]\n")
    assert recipe.train.optimizer.betas == [0.9, 0.99]
    assert "[train.optimizer]" in recipe.to_toml()
    assert 'optimizer = "muon"' in _with("[train]\noptimizer = \"muon\"\n").to_toml()
    with pytest.raises(RecipeError) as caught:
        _with("[train]\noptimizer = \"muonn\"\n")
    assert "did you mean 'muon'" in str(caught.value)
    with pytest.raises(RecipeError) as caught:
        _with("[train.optimizer]\nkind = \"muon\"\nrnk = 4\n")
    assert "train.optimizer.rnk" in str(caught.value)


def test_state_bytes_per_parameter():
    from tuiapp.core.config.optimizer import state_bytes

    matrix, vector = ((64, 32), "hidden", "mlp.up_proj"), ((32,), "other", "norm")
    assert state_bytes("adamw", [matrix, vector]) == 8 * (64 * 32 + 32)
    assert state_bytes("lion", [matrix, vector]) == 4 * (64 * 32 + 32)
    assert state_bytes("muon", [matrix, vector]) == 4 * 64 * 32 + 8 * 32
    assert state_bytes("muon", [((64, 32), "embedding", "embed_tokens")]) == 8 * 64 * 32
    assert state_bytes("adafactor", [matrix, vector]) == 4 * (64 + 32) + 4 * 32
    assert state_bytes("adafactor", [matrix], flattened=True) == 4 * 64 * 32
    assert state_bytes("adamw_8bit", [((256, 256), "hidden", "x")]) == 2 * (65536 + 4 * 256)
    assert state_bytes("adamw_8bit", [((256, 256), "embedding", "embed_tokens")]) == 8 * 65536  # 32-bit states


def test_estimate_counts_the_optimizer_and_the_fp32_master():
    tiny = dict(estimate.TINY_CONFIG)
    adamw = estimate.estimate_recipe(_with(""), tiny, 1, cuda=False)
    lion = estimate.estimate_recipe(_with("[train]\noptimizer = \"lion\"\n"), tiny, 1, cuda=False)
    assert adamw.memory.optimizer == 8 * adamw.trainable_params
    assert lion.memory.optimizer == 4 * lion.trainable_params
    half = estimate.estimate_recipe(_with("[train]\noptimizer = \"lion\"\nprecision = \"bf16\"\n"), tiny, 1)
    assert half.memory.optimizer == 8 * half.trainable_params  # + the fp32 master copy
    lora = estimate.estimate_recipe(parse_recipe("[method]\nkind = \"lora\"\n[train]\noptimizer = \"muon\"\n",
                                                 "x.toml"), tiny, 1, cuda=False)
    assert lora.memory.optimizer == 4 * lora.trainable_params  # LoRA's matrices are all Muon's


@pytest.mark.parametrize(("text", "cuda", "installed", "says"), [
    ("optimizer = \"adamw_8bit\"", False, True, "needs a CUDA GPU"),
    ("optimizer = \"adamw_8bit\"", True, False, "pip install 'llmtui[qlora]'"),
    ("optimizer = \"galore\"", True, True, "launch.strategy = 'ddp'"),
    ("optimizer = \"apollo\"", False, True, "needs a CUDA GPU"),
    ("optimizer = \"lion\"", True, False, "llmtui[optimizers]"),
    ("optimizer = \"schedule_free_adamw\"\nscheduler = \"constant\"\n[launch]\nzero_stage = 2", True, True,
     "launch.zero_stage = 0"),
    ("optimizer = \"muon\"\n[launch]\nstrategy = \"fsdp\"", True, True, "FSDP shards"),
    ("optimizer = \"muon\"\n[launch]\nzero_stage = 2\noffload_optimizer = \"cpu\"", True, True, "offload"),
    ("optimizer = \"adafactor\"\n[launch]\nstrategy = \"pipeline\"", True, True, "AdamW only"),
])
def test_refused_before_launch_with_the_fix(text, cuda, installed, says):
    from tuiapp.core.common.findings import format_findings
    from tuiapp.core.prelaunch import optimizer_checks

    findings = optimizer_checks.rules(_with("[train]\n" + text + "\n"), cuda=cuda, is_installed=lambda m: installed)
    errors = [f for f in findings if f.level == "error"]
    assert errors and all(f.key == "train.optimizer" and f.fix for f in errors)
    assert says in format_findings(findings)


def test_what_runs_here_is_not_refused():
    from tuiapp.core.prelaunch import machine_rules

    for kind in RUNS_HERE:
        recipe = _with(f"[train]\noptimizer = \"{kind}\"\nscheduler = \"constant\"\n")
        assert not [f for f in machine_rules.machine_rules(recipe, cuda=False) if f.key == "train.optimizer"], kind
    galore = _with("[train]\noptimizer = \"galore\"\n[launch]\nstrategy = \"ddp\"\n")
    from tuiapp.core.prelaunch import optimizer_checks

    assert not optimizer_checks.rules(galore, cuda=True, is_installed=lambda m: True)


def test_trainer_arguments_of_each_kind():
    from tuiapp.trainer.loop import optimizers

    assert optimizers.training_kwargs(_with(""))["optim"] == "adamw_torch_fused"  # CUDA and CPU alike
    offload = _with("[launch]\nzero_stage = 2\noffload_optimizer = \"cpu\"\n")
    assert optimizers.training_kwargs(offload)["optim"] == "adamw_torch"
    galore = optimizers.training_kwargs(_with("[train.optimizer]\nkind = \"galore\"\nrank = 16\n"))
    assert galore["optim"] == "galore_adamw" and "rank=16" in galore["optim_args"]
    assert galore["optim_target_modules"] == ["attn", "mlp"]
    assert optimizers.deepspeed_section(_with("[train]\noptimizer = \"muon\"\n"))["type"] == "muon"
    assert optimizers.deepspeed_section(_with("")) is None
    from tuiapp.trainer.loop.ds_config import deepspeed_config

    zero3 = _with("[train]\noptimizer = \"muon\"\n[launch]\nzero_stage = 3\n")
    config = optimizers.deepspeed_config(zero3, deepspeed_config(zero3))  # stage 3 refuses Muon with reduce-scatter
    assert config["optimizer"]["type"] == "muon" and config["zero_optimization"]["reduce_scatter"] is False
    zero2 = _with("[train]\noptimizer = \"muon\"\n[launch]\nzero_stage = 2\n")
    assert "reduce_scatter" not in optimizers.deepspeed_config(zero2, deepspeed_config(zero2))["zero_optimization"]
    adamw = _with("[launch]\nzero_stage = 3\n")
    assert optimizers.deepspeed_config(adamw, deepspeed_config(adamw)) == deepspeed_config(adamw)


def test_muon_part_steps_as_torchs_muon_and_the_rest_as_adamw():
    import torch

    from tuiapp.trainer.loop.optimizers import MuonWithAdamW

    torch.manual_seed(0)
    matrix, vector = torch.randn(48, 16), torch.randn(16)
    grads = [torch.randn(48, 16), torch.randn(16)]
    ours = [matrix.clone().requires_grad_(), vector.clone().requires_grad_()]
    ref = [matrix.clone().requires_grad_(), vector.clone().requires_grad_()]
    optimizer = MuonWithAdamW([{"params": [ours[0]], "use_muon": True, "weight_decay": 0.1},
                               {"params": [ours[1]], "use_muon": False, "weight_decay": 0.0}],
                              lr=1e-2, betas=(0.9, 0.999), eps=1e-8, momentum=0.95, ns_steps=5, lr_scale=1.0)
    muon = torch.optim.Muon([ref[0]], lr=1e-2, weight_decay=0.1, adjust_lr_fn="match_rms_adamw")
    adamw = torch.optim.AdamW([ref[1]], lr=1e-2, weight_decay=0.0)
    for _ in range(3):
        for params in (ours, ref):
            for p, g in zip(params, grads, strict=True):
                p.grad = g.clone()
        optimizer.step()
        muon.step()
        adamw.step()
    step = (ref[0] - matrix).abs().mean()
    assert (ours[0] - ref[0]).abs().mean() < 0.02 * step  # torch runs Newton-Schulz in bf16, ours in fp32 here
    assert torch.allclose(ours[1], ref[1])
    assert set(optimizer.state[ours[0]]) == {"momentum_buffer"}


def test_describe_names_the_optimizer_under_its_wrappers():
    import torch

    from tuiapp.trainer.loop.optimizers import describe

    class Wrapper:  # as DeepSpeed's ZeRO optimizer: not a torch optimizer, its param_groups are the inner's
        def __init__(self, inner):
            self.optimizer, self.param_groups = inner, inner.param_groups

    weight = torch.nn.Parameter(torch.zeros(4, 4))
    inner = torch.optim.AdamW([weight])
    weight.grad = torch.ones(4, 4)
    inner.step()
    described = describe(Wrapper(inner))
    assert described["optimizer"] == "torch.optim.adamw.AdamW" and described["optimizer_wrappers"] == ["Wrapper"]
    assert described["optimizer_state_bytes"] == 2 * 4 * 16 + 4  # exp_avg, exp_avg_sq and the step count
    assert describe(object()) == {}


def test_the_logged_rate_is_adamws_when_muon_steps_part_of_the_weights():
    import torch

    from tuiapp.trainer.loop.optimizers import logged_lr

    muon, adam = torch.nn.Parameter(torch.zeros(4, 4)), torch.nn.Parameter(torch.zeros(4))
    optimizer = torch.optim.SGD([{"params": [muon], "lr": 0.02, "use_muon": True},  # DeepSpeed's order: Muon first
                                 {"params": [adam], "lr": 0.003, "use_muon": False}], lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5)
    assert logged_lr(optimizer, scheduler, 0.01) == pytest.approx(0.0015)
    plain = torch.optim.SGD([adam], lr=0.003)
    assert logged_lr(plain, None, 0.003) == 0.003
