"""Rules of the recipe alone, on any machine: cross-field settings (DeepSpeed, peft, batching,
mixtures, streaming, scale-out strategy, pipeline) and the method's target modules against the
model's layers. The door (door.py) calls them: recipe_rules in its recipe phase, check_method
(it needs the model's config) in its machine phase, where it always ran.
"""

from __future__ import annotations

from pathlib import Path

from tuiapp.core.common.findings import Finding
from tuiapp.core.common.methods import METHODS, is_lora, is_quantized, is_trl, trains_on_text
from tuiapp.core.config.recipe import AUTO_EVAL_SPLIT, PROFILE_AFTER, Recipe
from tuiapp.core.plan import pipeline_plan
from tuiapp.core.plan.estimate import targeted_linears
from tuiapp.core.prelaunch.cluster_checks import scale_rules


def recipe_rules(recipe: Recipe) -> list[Finding]:
    """Cross-field rules that hold on any machine (DeepSpeed and peft constraints)."""
    out: list[Finding] = []
    train, launch, kind = recipe.train, recipe.launch, recipe.method.kind
    if recipe.dataset.eval_split_auto:
        asked = " and ".join(n for n, on in (("train.eval_steps", train.eval_steps), ("train.sample_prompts",
                                                                                    train.sample_prompts)) if on)
        mixture = bool(recipe.dataset.sources)  # each source without an eval_split of its own holds its share out
        share = AUTO_EVAL_SPLIT if mixture else recipe.dataset.eval_split
        where = "each source without an eval_split" if mixture else "the training data"
        setting = "eval_split in the [[dataset.sources]] tables" if mixture else "dataset.eval_split"
        out.append(Finding("info", "dataset.eval_split", f"{share:.0%} of {where} is "
                           f"held out for eval: {asked} {'ask' if ' and ' in asked else 'asks'} for evals, and eval_split 0 "
                           "would skip them",
                           f"set {setting} to another fraction or an eval file, or train.eval_steps = 0 "
                           "and no sample_prompts for no evals"))
    splits = [s.eval_split for s in recipe.dataset.sources] or [recipe.dataset.eval_split]
    if train.early_stopping_patience and (not train.eval_steps or all(s in (0, 0.0, "") for s in splits)):
        out.append(Finding("error", "train.early_stopping_patience", "early stopping watches the eval loss, but "
                           "this run never evaluates before its end", "set train.eval_steps > 0 and dataset.eval_split "
                           "(a fraction or a file), or early_stopping_patience = 0"))
    if train.eval_on_start and not train.eval_steps:
        out.append(Finding("error", "train.eval_on_start", "an evaluation before the first step is read against the "
                           "later ones, and this run has none (train.eval_steps = 0)",
                           "set train.eval_steps > 0, or eval_on_start = false"))
    out += profile_rules(recipe)
    if is_quantized(kind) and launch.zero_stage == 3:
        out.append(Finding("error", "launch.zero_stage", "ZeRO-3 cannot partition the 4-bit base "
                           "weights of qlora", "set launch.zero_stage = 2 or lower"))
    if not METHODS[kind].checkpointing and train.gradient_checkpointing:
        out.append(Finding("error", "train.gradient_checkpointing", "prefix tuning passes learned past "
                           "key/values, which gradient checkpointing does not support",
                           "set train.gradient_checkpointing = false"))
    if train.packing is True and not is_trl(kind) and not METHODS[kind].packs:
        out.append(Finding("error", "train.packing", f"{kind} adds virtual tokens or past key/values, "
                           "which would attend across packed examples",
                           "set train.packing = false (or 'auto')"))
    if launch.offload_params != "none" and launch.zero_stage != 3:
        out.append(Finding("error", "launch.offload_params",
                           f"parameter offload needs ZeRO-3; zero_stage is {launch.zero_stage}",
                           "set launch.zero_stage = 3, or launch.offload_params = 'none'"))
    if launch.offload_optimizer != "none" and launch.zero_stage == 0:
        out.append(Finding("error", "launch.offload_optimizer",
                           "optimizer offload needs ZeRO stage 1, 2 or 3; zero_stage is 0",
                           "set launch.zero_stage = 2, or launch.offload_optimizer = 'none'"))
    if "nvme" in (launch.offload_optimizer, launch.offload_params):
        if not launch.nvme_path:
            out.append(Finding("error", "launch.nvme_path", "nvme offload needs a folder on NVMe",
                               "set launch.nvme_path = '/path/on/local/nvme', or offload to 'cpu'"))
        elif not Path(launch.nvme_path).expanduser().is_dir():
            out.append(Finding("error", "launch.nvme_path",
                               f"nvme_path '{launch.nvme_path}' is not an existing folder",
                               "create it on a local NVMe drive, or fix the path"))

    out += batching_rules(recipe)
    out += mixture_rules(recipe)
    out += streaming_rules(recipe)
    out += scale_rules(recipe)
    out += pipeline_plan.rules(recipe)
    return out


def mixture_rules(recipe: Recipe) -> list[Finding]:
    """[[dataset.sources]]: what a mixture of sources trains (the Trainer of pretraining, SFT and the
    adapter methods, on text and chats, from tokenized cache entries)."""
    spec, kind = recipe.dataset, recipe.method.kind
    if not spec.sources:
        return []
    one = "or use one dataset (no [[dataset.sources]])"
    out: list[Finding] = []
    if is_trl(kind):
        out.append(Finding("error", "dataset.sources", f"{kind} reads its pairs, feedback or prompts from one "
                           "dataset: mixtures are for pretraining, SFT and the adapter methods", one))
    if spec.streaming:
        out.append(Finding("error", "dataset.streaming", "a mixture interleaves its sources' tokenized cache "
                           "entries, which a stream does not build", f"set dataset.streaming = false, {one}"))
    if recipe.launch.strategy == "pipeline":
        out.append(Finding("error", "launch.strategy", "the pipeline strategy batches one dataset",
                           f"use the deepspeed strategy, {one}"))
    return out


def streaming_rules(recipe: Recipe) -> list[Finding]:
    """dataset.streaming reads and tokenizes the files while training: what a stream cannot do."""
    spec, train, kind = recipe.dataset, recipe.train, recipe.method.kind
    if not spec.streaming or spec.sources:  # a mixture's stream: mixture_rules
        return []
    out: list[Finding] = []
    off = "or dataset.streaming = false"
    if is_trl(kind):
        out.append(Finding("error", "dataset.streaming", f"{kind} reads its pairs or prompts whole: streaming is for "
                           "pretraining, SFT and the adapter methods", "set dataset.streaming = false"))
    if not train.max_steps:
        out.append(Finding("error", "train.max_steps", "a stream has no length, so epochs cannot be counted",
                           f"set train.max_steps (e.g. 1000), {off}"))
    if train.batching == "tokens":
        out.append(Finding("error", "train.batching", "token-budget batches sort the whole dataset by length",
                           f"set train.batching = 'examples', {off}"))
    if train.micro_batch == "auto":
        out.append(Finding("error", "train.micro_batch", "'auto' is probed on the dataset's longest examples, which a "
                           "stream does not know ahead", f"set train.micro_batch to a number (e.g. 8), {off}"))
    if recipe.launch.strategy == "pipeline":
        out.append(Finding("error", "launch.strategy", "the pipeline strategy cuts its batches from a dataset of "
                           "known length", f"use the deepspeed strategy, {off}"))
    fraction = isinstance(spec.eval_split, float) or _is_number(spec.eval_split)
    if fraction and float(spec.eval_split) > 0:
        out.append(Finding("error", "dataset.eval_split", "a stream cannot hold a fraction out",
                           f"set dataset.eval_split to an eval file (e.g. 'data/eval.jsonl') or 0, {off}"))
    elif fraction and (train.eval_steps or train.sample_prompts):
        out.append(Finding("error", "dataset.eval_split", "evals are asked for (train.eval_steps or sample_prompts), "
                           "and a stream holds nothing out for them",
                           f"set dataset.eval_split to an eval file, or train.eval_steps = 0 and no sample_prompts, {off}"))
    return out


def _is_number(value) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


def profile_rules(recipe: Recipe) -> list[Finding]:
    """train.profile_steps: steps after the first PROFILE_AFTER, in the Trainer's loop."""
    steps, train = recipe.train.profile_steps, recipe.train
    if not steps:
        return []
    if recipe.launch.strategy == "pipeline":
        return [Finding("error", "train.profile_steps", "the pipeline strategy's own step loop is not profiled",
                        "set train.profile_steps = 0, or launch.strategy = 'deepspeed'")]
    if train.max_steps and train.max_steps < PROFILE_AFTER + steps:
        return [Finding("warning", "train.profile_steps", f"the profile starts after step {PROFILE_AFTER}; max_steps "
                        f"{train.max_steps} leaves {max(0, train.max_steps - PROFILE_AFTER)} of the {steps} steps "
                        f"asked for", f"set train.max_steps >= {PROFILE_AFTER + steps} for the whole profile")]
    return []


def batching_rules(recipe: Recipe) -> list[Finding]:
    """batching 'tokens' packs examples: only for the methods whose batches can be packed."""
    train, kind = recipe.train, recipe.method.kind
    if train.batching != "tokens":
        return []
    if trains_on_text(kind) or not METHODS[kind].packs:
        return [Finding("error", "train.batching", f"token budgets pack examples into rows; {kind} batches "
                        "cannot be packed (pretrain blocks are full already)", "set train.batching = 'examples'")]
    if train.packing is False:
        return [Finding("error", "train.batching", "batching 'tokens' packs the examples of a micro batch, "
                        "and train.packing is false", "set train.packing = 'auto', or train.batching = 'examples'")]
    if 0 < train.tokens_per_batch < train.max_seq_len:
        return [Finding("error", "train.tokens_per_batch", f"{train.tokens_per_batch} is below max_seq_len "
                        f"({train.max_seq_len}): the longest examples would not fit a micro batch",
                        f"set train.tokens_per_batch >= {train.max_seq_len} (or 0 = micro_batch x max_seq_len)")]
    return []


def check_method(recipe: Recipe, model_config: dict) -> list[Finding]:
    """Method settings that must match the model's layers."""
    method = recipe.method
    targets = getattr(method, "target_modules", None)
    if is_lora(method.kind) and targets != "all-linear":
        if not targeted_linears(model_config, targets):
            return [Finding("error", "method.target_modules",
                            f"target_modules {targets} match no linear layer of this model",
                            "use 'all-linear' or names such as ['q_proj', 'v_proj'] "
                            "(gpt2: 'c_attn'; gpt-neox: 'query_key_value')")]
    return []
