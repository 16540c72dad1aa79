"""One rank's training: frozen recipe in, metrics, checkpoints and final model out."""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from pathlib import Path

import torch
import torch.distributed as dist
import transformers
from transformers import Trainer, TrainingArguments

from tuiapp.core.common.errors import DatasetError
from tuiapp.core.common.methods import METHODS, is_preference, is_reward_model, peft_of
from tuiapp.core.config import trackers
from tuiapp.core.config.frozen import frozen_recipe
from tuiapp.core.config.recipe import (
    Recipe,
    packing_enabled,
    tokens_per_batch,
    weights_method,
)
from tuiapp.core.run_folder import events as ev
from tuiapp.core.run_folder.metrics import JsonlWriter
from tuiapp.core.run_folder.rundir import (
    RunDir,
)
from tuiapp.trainer import phases
from tuiapp.trainer.dataset import buckets, loader, mixture, sampling, streaming
from tuiapp.trainer.loop import checkpoints, cpu_dropout, optimizers, profiling, strategies, trained_logits
from tuiapp.trainer.loop import resume as resume_edges
from tuiapp.trainer.loop.callbacks import EvalSamples, GracefulStop, RunRecorder
from tuiapp.trainer.loop.early_stop import early_stopping
from tuiapp.trainer.methods.adapters import apply_method
from tuiapp.trainer.models import bottleneck, long_context, varlen, vision
from tuiapp.trainer.models.bundled import resolve_model_path
from tuiapp.trainer.models.model import (
    FINAL_INFO,
    attn_implementation,
    cache_dir,
    keep_sentencepiece,
    load_model,
    load_tokenizer,
    model_plan,
    model_profile,
)


def keep_deepspeed_grad_norm(engine) -> None:
    """DeepSpeed's ZeRO-0 fp32 path (every CPU run at stage 0) clips the gradients with
    deepspeed.runtime.utils.clip_grad_norm_ and drops the norm it returns: the engine's
    get_global_grad_norm() stays None, and so does every logged grad_norm. Keep it."""
    if not (hasattr(engine, "clip_fp32_gradients") and hasattr(engine, "_global_grad_norm")):
        return
    from deepspeed.runtime.utils import clip_grad_norm_

    def clip_and_keep_norm():
        engine._global_grad_norm = clip_grad_norm_(parameters=engine.module.parameters(),
                                                   max_norm=engine.gradient_clipping(), mpu=engine.mpu)

    engine.clip_fp32_gradients = clip_and_keep_norm


def resolve_precision(requested: str) -> str:
    cuda = torch.cuda.is_available()
    if requested == "auto":
        if cuda:
            return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
        return "fp32"
    if requested in ("bf16", "fp16", "fp8") and not cuda:
        raise RuntimeError(f"train.precision = '{requested}' needs CUDA; set it to 'fp32' or 'auto'")
    return requested


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _is_main() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


class RunTrainerMixin:
    """Mixed into every run's Trainer (transformers' or one of TRL's): checkpoints appear only once
    complete, and bottleneck adapters are saved on their own."""

    method_kind: str = ""
    base_model: str = ""
    step_agreement: GracefulStop | None = None  # sums the ranks' token counts
    _grad_norm_kept = False

    _source_tokens = None  # a mixture's micro batch: its tokens per source, taken off the batch

    def training_step(self, model, *args, **kwargs):
        inputs = args[0] if args else kwargs.get("inputs")
        if inputs is not None and mixture.SOURCE_TOKENS in inputs:  # counted, not a model input
            self._source_tokens = inputs.pop(mixture.SOURCE_TOKENS)
        if not self._grad_norm_kept:
            self._grad_norm_kept = True
            keep_deepspeed_grad_norm(model)
        return super().training_step(model, *args, **kwargs)

    def _get_learning_rate(self):
        """The logged `lr`: AdamW's rate where Muon steps part of the weights (DeepSpeed's Muon puts
        its own, scaled group first), so a Muon run's lr column reads the same under every engine."""
        return optimizers.logged_lr(self.optimizer, self.lr_scheduler, super()._get_learning_rate())

    def _track_num_input_tokens(self, inputs):
        """Non-padding tokens counted on this rank without a collective or a host sync, handed to
        the step agreement (GracefulStop), which sums the ranks' counts on the all_reduce it makes
        anyway. The Trainer's own count gathers them and waits for the device every micro batch."""
        name = getattr(self.model, "main_input_name", "input_ids")
        sources, self._source_tokens = self._source_tokens, None
        if sources is not None and self.step_agreement is not None:  # a mixture: its total is theirs
            self.step_agreement.add_source_tokens(sources)
            self.step_agreement.add_tokens(sources.sum())
            return
        if self.step_agreement is None or name not in inputs:
            return super()._track_num_input_tokens(inputs)
        pad = getattr(self.processing_class, "pad_token_id", None)
        if "attention_mask" in inputs:
            tokens = inputs["attention_mask"].sum()
        elif pad is not None:
            tokens = (inputs[name] != pad).sum()
        else:
            tokens = torch.tensor(inputs[name].numel())
        self.step_agreement.add_tokens(tokens.to(torch.int64))

    sequence_parallel = False  # train.sequence_parallel > 1: each batch is this rank's shard of the sequences
    trained_logits_only = False  # set where trained_logits.applies: training batches skip the prompts' logits

    def compute_loss(self, model, inputs, *args, **kwargs):
        if self.trained_logits_only and model.training:
            inputs = trained_logits.narrowed(inputs)
        if self.sequence_parallel and model.training:  # the whole sequence's token mean, this shard's gradient
            return long_context.group_loss(model, inputs, args[0] if args else kwargs.get("return_outputs", False))
        return super().compute_loss(model, inputs, *args, **kwargs)

    token_budget = 0  # train.batching = "tokens": the token budget of a micro batch

    def get_train_dataloader(self):
        """batching 'tokens': micro batches cut to a token budget, the same on every rank, each rank
        taking its own (the sharding wrapper accelerate adds is made a passthrough, as the Trainer
        does for its own rank-aware batch sampler)."""
        if not self.token_budget:
            loader = super().get_train_dataloader()
            sampling.make_lean(loader)  # the epoch's order is not made into one Python list
            return loader
        from torch.utils.data import DataLoader

        from tuiapp.trainer.dataset.packing import TokenBudgetBatches

        dataset = self._remove_unused_columns(self.train_dataset, description="Training")
        sampler = TokenBudgetBatches(sampling.example_lengths(dataset), self.token_budget, self.args.seed,
                                     rank=self.args.process_index, world=self.args.world_size)
        loader = self.accelerator.prepare(DataLoader(dataset, batch_sampler=sampler, collate_fn=self.data_collator,
                                                     num_workers=self.args.dataloader_num_workers))
        shard = getattr(loader, "batch_sampler", None)
        if shard is not None and getattr(shard, "batch_sampler", None) is sampler:
            shard.num_processes, shard.process_index = 1, 0
        return loader

    def _save_checkpoint(self, model, trial):
        if self.step_agreement is not None:
            self.step_agreement.settle(self.state)  # the saved state carries the count
        root = Path(self.args.output_dir)
        staging = root / checkpoints.STAGING
        name = f"checkpoint-{self.state.global_step}"
        self.args.output_dir = str(staging)
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self.args.output_dir = str(root)
        _barrier()
        if _is_main():
            checkpoints.publish(staging, name, root, self.args.save_total_limit or 2)
            resume_edges.pause_at(f"checkpoint:{self.state.global_step}", root.parent)
        _barrier()

    def _run_epoch(self, *args, **kwargs):
        if resume_edges.nothing_left(self.state):  # resumed at max_steps: its loop would train one step more
            self.control.should_training_stop = True
            return None
        return super()._run_epoch(*args, **kwargs)

    def _save(self, output_dir=None, state_dict=None):
        if peft_of(self.method_kind) != "bottleneck":
            return super()._save(output_dir, state_dict)
        if not self.args.should_save:
            return  # FSDP calls _save on every rank (with an empty state dict off rank 0)
        if state_dict is None:
            state_dict = self.model.state_dict()
        bottleneck.save_bottleneck(output_dir, state_dict, self.model.bottleneck_config)
        if self.processing_class is not None:
            self.processing_class.save_pretrained(output_dir)


class RunTrainer(strategies.StrategyMixin, vision.PartLearningRates, RunTrainerMixin, Trainer):
    """The Trainer of pretraining, SFT and the adapter methods."""


def _training_args(recipe: Recipe, run_dir: Path, precision: str, has_eval: bool) -> TrainingArguments:
    return TrainingArguments(**training_kwargs(recipe, run_dir, precision, has_eval))


def training_kwargs(recipe: Recipe, run_dir: Path, precision: str, has_eval: bool) -> dict:
    """TrainingArguments of a run as keywords (TRL's configs take the same ones, and more)."""
    train = recipe.train
    extra = strategies.training_kwargs(recipe, run_dir=run_dir)  # deepspeed config, or FSDP/DDP settings
    if "deepspeed" in extra:  # muon: DeepSpeed's ZeRO-aware Muon
        extra["deepspeed"] = optimizers.deepspeed_config(recipe, extra["deepspeed"])
    extra.update(optimizers.training_kwargs(recipe))  # train.optimizer: optim name, betas, eps
    if recipe.dataset.streaming:
        extra["accelerator_config"] = {**extra.get("accelerator_config", {}), **streaming.accelerator_config()}
    return dict(
        output_dir=str(RunDir(run_dir).checkpoints),
        per_device_train_batch_size=train.micro_batch,
        per_device_eval_batch_size=train.micro_batch,
        gradient_accumulation_steps=train.grad_accum,
        learning_rate=train.learning_rate,
        lr_scheduler_type=train.scheduler if train.scheduler != "constant" else "constant_with_warmup",
        warmup_steps=train.warmup_ratio,
        weight_decay=train.weight_decay,
        max_grad_norm=train.max_grad_norm,
        num_train_epochs=train.epochs,
        max_steps=train.max_steps or -1,
        seed=train.seed,
        data_seed=train.seed,
        logging_steps=train.logging_steps,
        logging_first_step=True,
        logging_nan_inf_filter=False,  # its isnan check read the loss on the host every micro batch
        eval_strategy=("steps" if train.eval_steps else "no") if has_eval else "no",
        eval_steps=train.eval_steps or None,
        eval_on_start=bool(train.eval_on_start and train.eval_steps and has_eval),
        save_strategy="steps" if train.save_steps else "no",
        save_steps=train.save_steps or 500,
        save_total_limit=train.save_total_limit,
        bf16=precision in ("bf16", "fp8"),  # fp8: bf16 with float8 linears (trainer/loop/fp8.py)
        fp16=precision == "fp16",
        activation_checkpointing=train.gradient_checkpointing,
        activation_checkpointing_kwargs={"use_reentrant": False} if train.gradient_checkpointing else None,
        **trackers.training_kwargs(recipe.train.report_to, run_dir),  # tensorboard/wandb/mlflow, offline
        disable_tqdm=True,
        remove_unused_columns=False,
        include_num_input_tokens_seen="no",  # counted by RunTrainerMixin and GracefulStop instead
        use_liger_kernel=train.liger_kernel,  # preflight: CUDA and the liger-kernel package
        torch_compile=train.torch_compile,
        save_only_model=False,
        **loader.loader_settings(cuda=torch.cuda.is_available(), cpus=os.cpu_count() or 1,
                                 ranks_per_node=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
                                 streaming=recipe.dataset.streaming),  # workers, pinned memory on a GPU
        **_sequence_parallel_kwargs(recipe, precision),  # train.sequence_parallel: ParallelismConfig
        **extra,
    )


def _sequence_parallel_kwargs(recipe: Recipe, precision: str) -> dict:
    if long_context.degree(recipe) <= 1:
        return {}
    return long_context.training_kwargs(recipe, attn_implementation(recipe.model.attn_implementation, precision))


def _varlen_attention(model) -> bool:
    """Attention kernels that take packed sequences without a (Σ lengths)² mask."""
    return varlen.runs_varlen(getattr(model.config, "_attn_implementation", None), torch.cuda.is_available())


def train(run_dir: Path, resume: bool) -> int:
    run_dir = Path(run_dir).resolve()
    recipe = frozen_recipe(run_dir)
    transformers.logging.set_verbosity_warning()
    stopper = GracefulStop()
    # before any process group: transformers' save_pretrained writes nothing off rank 0 once one
    # exists, so a rank building the tiny model then would publish a folder without weights
    model_path = resolve_model_path(recipe.model.name)
    strategies.prepare_distributed(recipe, run_dir)  # CPU DeepSpeed: builds its comm op, joins the ranks
    precision = resolve_precision(recipe.train.precision)
    phases.enter("loading tokenizer")
    tokenizer = load_tokenizer(model_path, recipe.model.trust_remote_code, recipe)
    build = BUILDERS[METHODS[recipe.method.kind].family]  # the method's row picks its trainer
    trainer, recorder, eval_set = build(recipe, run_dir, model_path, precision, tokenizer, stopper)
    return _train_and_save(trainer, recorder, stopper, recipe, run_dir, model_path, eval_set, resume)


def _datasets(recipe: Recipe, model_path: str, tokenizer):
    """(processor or None, train set, eval set or None) of a supervised or preference recipe: image chats
    or pairs with a vision-language model's processor, else tokenized text."""
    from tuiapp.trainer.dataset.data import build_datasets

    processor = vision.load_processor(model_path, recipe.model.trust_remote_code) \
        if vision.is_vision_model(model_path) else None
    if processor is not None and recipe.dataset.sources:
        from tuiapp.core.prelaunch.vision_checks import MIXTURE_REFUSED  # preflight refuses it first

        message, fix = MIXTURE_REFUSED
        raise DatasetError(message=message, key="dataset.sources", fix=fix)
    if processor is not None:  # image chats: raw records, tokenized with their images per batch
        vision.apply_max_pixels(processor, recipe.vision.max_pixels)
        phases.enter("reading images")
        if is_preference(recipe.method.kind):  # dpo on image pairs
            from tuiapp.trainer.methods.vision_preference import image_pairs

            train_set, eval_set = image_pairs(recipe, processor)
        else:
            train_set, eval_set = vision.vision_datasets(recipe, processor=processor)
    else:
        phases.enter("tokenizing")
        datasets_of = streaming.build_datasets if recipe.dataset.streaming else build_datasets
        train_set, eval_set = datasets_of(recipe, tokenizer, cache_dir())
    if not (recipe.train.eval_steps or recipe.train.sample_prompts):
        eval_set = None  # train.eval_steps = 0: no evaluation, not even after the last step
    transformers.set_seed(recipe.train.seed)  # adapters are initialised before the Trainer seeds
    return processor, train_set, eval_set


def _supervised_trainer(recipe: Recipe, run_dir: Path, model_path: str, precision: str, tokenizer, stopper):
    """The families full and adapter: the Trainer (RunTrainer) on the whole model or its peft adapter."""
    processor, train_set, eval_set = _datasets(recipe, model_path, tokenizer)
    model = _supervised_model(recipe, run_dir, model_path, precision, processor)
    if not strategies.joined_early(recipe, run_dir):
        phases.enter("joining ranks")  # the process group starts with the training arguments
    args = _training_args(recipe, run_dir, precision, eval_set is not None)
    recorder = RunRecorder(run_dir, socket.gethostname(), agreement=stopper)
    recorder.source_keys = [source.key for source in recipe.dataset.sources]  # tokens/<label> per row
    stopper.source_count = len(recipe.dataset.sources)
    _count_active(recorder, recipe, model_path)
    callbacks = [stopper, *_eval_callbacks(recipe, recorder, tokenizer, eval_set)]
    callbacks += [*early_stopping(recipe, recorder), *_expert_load(model, recipe, model_path), recorder]
    trainer = RunTrainer(
        model=model,
        args=args,
        train_dataset=train_set,
        eval_dataset=eval_set,
        data_collator=_supervised_collator(recipe, model, tokenizer, processor),
        processing_class=processor or tokenizer,
        callbacks=callbacks,
    )
    trainer.method_kind = recipe.method.kind
    optimizers.install(trainer, recipe)  # muon, lion: the Trainer's optimizer_cls_and_kwargs
    trainer.step_agreement = stopper
    if processor is not None:
        trainer.part_lrs = vision.part_param_lrs(model, recipe)  # [vision]'s own learning rates
    trainer.trained_logits_only = processor is None and long_context.degree(recipe) == 1 and \
        trained_logits.applies(model, recipe.method.kind, recipe.train.liger_kernel)
    trainer.sequence_parallel = long_context.degree(recipe) > 1
    if recipe.train.batching == "tokens":
        trainer.token_budget = tokens_per_batch(recipe)
    return trainer, recorder, eval_set


def _supervised_model(recipe: Recipe, run_dir: Path, model_path: str, precision: str, processor):
    """The model with the method applied (peft adapter, vision parts), fp8-converted when asked."""
    phases.enter("loading model")
    _record_plan(run_dir, recipe, model_path, precision)
    if processor is not None:
        model = vision.apply_vision_method(vision.load_vision_model(recipe, model_path, precision), recipe)
    else:
        model = apply_method(load_model(recipe, model_path, precision), recipe, model_path)
    if precision == "fp8":
        from tuiapp.trainer.loop import fp8

        fp8.convert(model)
    if recipe.train.gradient_checkpointing and hasattr(model, "enable_input_require_grads"):
        model.enable_input_require_grads()
    return model


def _eval_callbacks(recipe: Recipe, recorder: RunRecorder, tokenizer, eval_set) -> list:
    """Sample answers and benchmark scores at each evaluation (none without an eval set)."""
    if eval_set is None:
        return []
    callbacks = []
    if recipe.train.sample_prompts:
        callbacks.append(
            EvalSamples(recorder, tokenizer, recipe.train.sample_prompts, recipe.train.sample_max_new_tokens,
                        recipe.launch.zero_stage == 3 or strategies.strategy_of(recipe) == "fsdp")
        )
    if recipe.eval.benchmarks:  # scored on this model, into the eval row
        from tuiapp.trainer.loop.benchmarks import Benchmarks

        callbacks.append(Benchmarks(recorder, tokenizer, recipe.eval.benchmarks, recipe.eval.benchmark_at, Path.cwd()))
    return callbacks


def _supervised_collator(recipe: Recipe, model, tokenizer, processor):
    """Image chats' collator, or packed/padded text (packed lengths in a few shapes on a GPU, each source's
    tokens counted); then sequence parallelism's split, tiled MLP and activation offload."""
    from tuiapp.trainer.dataset.data import make_collator

    collator = vision.VisionCollator(processor, recipe.train.max_seq_len) if processor is not None else \
        mixture.SourceTokens(buckets.BucketedLengths(
            make_collator(recipe, tokenizer, varlen_attention=_varlen_attention(model)),
            buckets.bucket_multiple(torch.cuda.is_available()) if packing_enabled(recipe) else 0,
            tokenizer.pad_token_id), len(recipe.dataset.sources))
    return long_context.prepare(model, recipe, collator, tokenizer)

def _count_active(recorder: RunRecorder, recipe: Recipe, model_path: str) -> None:
    """The recorder's model TFLOP/s counts the parameters a token goes through (a mixture of experts:
    the active ones, from the model profile)."""
    profile = model_profile(model_path, recipe.model.trust_remote_code)
    if profile is not None:
        recorder.active_parameters = profile.active_parameters


def _expert_load(model, recipe: Recipe, model_path: str) -> list:
    """The experts' load metrics (trainer.moe) on a mixture-of-experts model, before the recorder."""
    profile = model_profile(model_path, recipe.model.trust_remote_code)
    moe = profile.moe if profile is not None else None
    if not moe:
        return []
    from tuiapp.trainer.models.moe import ExpertLoad

    return [ExpertLoad(model, moe["experts"])]


def _record_plan(run_dir: Path, recipe: Recipe, model_path: str, precision: str) -> None:
    """The model plan (attention kernel, adapter targets, notes) as a run event, from rank 0."""
    plan = model_plan(recipe, model_path, precision)
    if _is_main():
        with JsonlWriter(RunDir(run_dir).events) as events:
            events.write({"time": time.time(), **plan.to_event()})


def _rl_trainer(recipe: Recipe, run_dir: Path, model_path: str, precision: str, tokenizer, stopper):
    """The family rl: TRL's GRPO/RLOO, prompts in, completions generated while training."""
    from tuiapp.trainer.methods import rl

    phases.enter("tokenizing")
    train_set, eval_set = rl.build_datasets(recipe, Path.cwd())
    transformers.set_seed(recipe.train.seed)
    phases.enter("loading model")
    model, peft_config = rl.load_policy(recipe, model_path, precision)
    if not strategies.joined_early(recipe, run_dir):
        phases.enter("joining ranks")
    kwargs = training_kwargs(recipe, run_dir, precision, eval_set is not None)
    recorder = RunRecorder(run_dir, socket.gethostname(), loss_is_nll=False, agreement=stopper)
    _count_active(recorder, recipe, model_path)
    callbacks = [stopper, *early_stopping(recipe, recorder), recorder]
    trainer = rl.build_trainer(recipe, run_dir, model, peft_config, kwargs, train_set, eval_set, tokenizer, callbacks,
                               mixins=(strategies.StrategyMixin, RunTrainerMixin))
    trainer.method_kind = recipe.method.kind
    optimizers.install(trainer, recipe)  # muon, lion: the Trainer's optimizer_cls_and_kwargs
    trainer.step_agreement = stopper
    if _is_main():
        with JsonlWriter(RunDir(run_dir).events) as events:
            events.write(rl.generation_event(recipe))
    return trainer, recorder, eval_set


def _preference_trainer(recipe: Recipe, run_dir: Path, model_path: str, precision: str, tokenizer, stopper):
    """The family preference: TRL's trainers (dpo, simpo, cpo, orpo, kto, reward), image pairs too."""
    from tuiapp.trainer.methods import preference, vision_preference

    processor, train_set, eval_set = _datasets(recipe, model_path, tokenizer)
    phases.enter("loading model")
    _record_plan(run_dir, recipe, model_path, precision)
    if processor is not None:  # image pairs: the VLM with [vision]'s parts, TRL's vision collator
        model, ref_model = vision_preference.load_models(recipe, model_path, precision)
        peft_config = None
    else:
        model, ref_model, peft_config = preference.load_models(recipe, model_path, precision)
    if not strategies.joined_early(recipe, run_dir):
        phases.enter("joining ranks")
    kwargs = training_kwargs(recipe, run_dir, precision, eval_set is not None)
    recorder = RunRecorder(run_dir, socket.gethostname(), loss_is_nll=False, agreement=stopper)
    _count_active(recorder, recipe, model_path)
    callbacks = [stopper]
    if eval_set is not None and recipe.train.sample_prompts and not is_reward_model(recipe.method.kind):
        callbacks.append(
            EvalSamples(recorder, tokenizer, recipe.train.sample_prompts, recipe.train.sample_max_new_tokens,
                        recipe.launch.zero_stage == 3 or strategies.strategy_of(recipe) == "fsdp")
        )
    callbacks += [*early_stopping(recipe, recorder), *_expert_load(model, recipe, model_path), recorder]
    if processor is not None:
        trainer = vision_preference.build_trainer(recipe, model, ref_model, kwargs, train_set, eval_set, processor,
                                                  callbacks, mixins=(strategies.StrategyMixin, RunTrainerMixin))
    else:
        trainer = preference.build_trainer(
            recipe, model, ref_model, peft_config, kwargs, train_set, eval_set, tokenizer, callbacks,
            mixins=(strategies.StrategyMixin, RunTrainerMixin),
        )
    trainer.method_kind = recipe.method.kind
    optimizers.install(trainer, recipe)  # muon, lion: the Trainer's optimizer_cls_and_kwargs
    trainer.step_agreement = stopper
    if _is_main():  # before the first step, so a stop at any time finds it
        with JsonlWriter(RunDir(run_dir).events) as events:
            events.write(preference.reference_event(trainer))
    return trainer, recorder, eval_set


def _distill_trainer(recipe: Recipe, run_dir: Path, model_path: str, precision: str, tokenizer, stopper):
    """The family distill: a frozen teacher's distributions (trainer/methods/distill.py)."""
    from tuiapp.trainer.methods import distill

    _processor, train_set, eval_set = _datasets(recipe, model_path, tokenizer)
    trainer, recorder = distill.build_trainer(recipe, run_dir, model_path, precision, tokenizer, train_set,
                                              eval_set, stopper, RunTrainer, training_kwargs)
    return trainer, recorder, eval_set


BUILDERS = {
    "full": _supervised_trainer,
    "adapter": _supervised_trainer,
    "preference": _preference_trainer,
    "rl": _rl_trainer,
    "distill": _distill_trainer,
}
"""A method family's trainer builder: (recipe, run_dir, model_path, precision, tokenizer, stopper) ->
(trainer, recorder, eval set or None). core/common/methods.py gives each kind its family."""


def _train_and_save(trainer, recorder, stopper, recipe: Recipe, run_dir: Path, model_path: str, eval_set,
                    resume: bool) -> int:
    if not torch.cuda.is_available():  # the adapters are attached by now, TRL's too
        swapped = cpu_dropout.install(trainer.model)
        if swapped and _is_main():
            print(f"dropout: {swapped} module(s) draw their masks from numpy's SFC64 (CPU)", flush=True)
    ckpt_root = RunDir(run_dir).checkpoints
    resume_from = None
    if resume:
        last = checkpoints.last_checkpoint(ckpt_root)
        resume_from = str(last) if last is not None else None
        if _is_main():  # rows past the checkpoint (all of them without one) are written again
            resume_edges.trim_metrics(run_dir, checkpoints.checkpoint_step(last) if last is not None else 0)
    _barrier()
    if _is_main():
        checkpoints.clear_staging(ckpt_root)
        try:
            ckpt_root.rmdir()  # the Trainer makes it up front; a run that saves nothing leaves none
        except OSError:
            pass  # holds checkpoints
    if resume_from is not None:
        trainer.args.eval_on_start = False  # the base's evaluation is in the rows kept from the first attempt
    if recipe.train.profile_steps:
        trainer.add_callback(profiling.StepProfiler(run_dir, recipe.train.profile_steps, recorder))
    trainer.train(resume_from_checkpoint=resume_from)

    if stopper.stopped:
        recorder.event(trainer.state, {"event": ev.STOP_CHECKPOINT, "step": trainer.state.global_step})
        return 0
    if eval_set is not None and not recipe.train.eval_steps:
        trainer.evaluate()  # eval_steps 0 with sample_prompts: one evaluation to answer them
    _save_final(trainer, run_dir, recipe, model_path)
    recorder.event(trainer.state, {"event": ev.FINISHED, "step": trainer.state.global_step})
    return 0


def _save_final(trainer: RunTrainer, run_dir: Path, recipe: Recipe, model_path: str) -> None:
    staging = RunDir(run_dir).final_staging
    final = RunDir(run_dir).final
    if _is_main():
        shutil.rmtree(staging, ignore_errors=True)
    _barrier()
    trainer.model.config.use_cache = True  # trained without a KV cache (load_model); generates with one
    trainer.save_model(str(staging))
    _barrier()
    if _is_main():
        info = {
            "method": recipe.method.kind,
            "weights": weights_method(recipe.method).kind,  # what trained: sft (all), an adapter kind
            "base_model": str(model_path),
            "recipe_name": recipe.name,
            "step": trainer.state.global_step,
        }
        (staging / FINAL_INFO).write_text(json.dumps(info, indent=2))
        tokenizer = trainer.processing_class
        if tokenizer is not None and not (staging / "tokenizer_config.json").exists():
            tokenizer.save_pretrained(staging)
        keep_sentencepiece(staging, model_path)
        resume_edges.pause_at("final", run_dir)
        if final.exists():
            shutil.rmtree(final)
        os.replace(staging, final)
    _barrier()
