"""Training with `launch.strategy = "pipeline"`: the model cut into stages by decoder layers,
each step's batch split into micro-batches that flow through the stages
(torch.distributed.pipelining: Schedule1F1B or ScheduleGPipe), data parallel across pipeline
replicas when the ranks are a multiple of the stages.

Ranks come from the same DeepSpeed launcher as every run (RANK / WORLD_SIZE / MASTER_ADDR); the
process group is gloo on CPU, NCCL on CUDA. Rank r is stage r % p of replica r // p. What the run
writes is what a Trainer run writes: RunRecorder's metrics rows and events, checkpoints that
resume, final/ as one HF model.

The same data order and optimisation as the Trainer's, so the loss curves compare: the Trainer's
seeded random sampler (seed + epoch), AdamW, transformers' LR schedule, the loss summed over the
step's tokens and divided by their count (HF's num_items_in_batch), and gradient clipping by the
norm over every stage (squares summed across the pipeline, a tied head counted once).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import socket
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist
import transformers
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from transformers.trainer_pt_utils import get_parameter_names

from tuiapp.core.config.frozen import frozen_recipe
from tuiapp.core.config.recipe import Recipe
from tuiapp.core.plan.pipeline_plan import split_layers
from tuiapp.core.run_folder import events as ev
from tuiapp.core.run_folder.rundir import RunDir
from tuiapp.trainer import phases
from tuiapp.trainer.loop import checkpoints
from tuiapp.trainer.loop.callbacks import GracefulStop, RunRecorder, generate_samples
from tuiapp.trainer.models.bundled import resolve_model_path
from tuiapp.trainer.models.model import FINAL_INFO, cache_dir, keep_sentencepiece, load_model, load_tokenizer
from tuiapp.trainer.pipeline import checkpoints as stage_ckpt
from tuiapp.trainer.pipeline.stage import IGNORE, CausalLoss, cut, hf_state_dict, load_hf_state_dict, tied_head


class Topology:
    """Where this rank sits: stage of its pipeline, replica of its stage, and the groups."""

    def __init__(self, stages: int, device: torch.device):
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        if self.world % stages:
            raise RuntimeError(f"launch.pipeline_stages = {stages} does not divide the {self.world} ranks; set "
                               f"launch.gpus to a multiple of {stages}")
        self.stages, self.replicas = stages, self.world // stages
        self.stage, self.replica = self.rank % stages, self.rank // stages
        mesh = init_device_mesh(device.type, (self.replicas, stages), mesh_dim_names=("dp", "pp"))
        self.pp_group, self.dp_group = mesh.get_group("pp"), mesh.get_group("dp")
        self.tied_group = None
        for replica in range(self.replicas):  # every rank creates every group, in the same order
            ranks = [replica * stages, replica * stages + stages - 1]
            group = dist.new_group(ranks) if stages > 1 else None
            if replica == self.replica:
                self.tied_group = group

    @property
    def first(self) -> bool:
        return self.stage == 0

    @property
    def last(self) -> bool:
        return self.stage == self.stages - 1


def _device() -> torch.device:
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu")


def _precision(recipe: Recipe) -> str:
    """bf16 autocast on CUDA that supports it (train.precision 'auto' or 'bf16'), else fp32."""
    requested = recipe.train.precision
    cuda = torch.cuda.is_available()
    if requested in ("bf16", "fp16") and not cuda:
        raise RuntimeError(f"train.precision = '{requested}' needs CUDA; set it to 'fp32' or 'auto'")
    if requested == "bf16" and not torch.cuda.is_bf16_supported():
        raise RuntimeError("train.precision = 'bf16' needs a GPU with bf16; set it to 'fp32' or 'auto'")
    if requested in ("auto", "bf16") and cuda and torch.cuda.is_bf16_supported():
        return "bf16"
    return "fp32"


def _optimizer(stage: torch.nn.Module, recipe: Recipe) -> torch.optim.Optimizer:
    """AdamW with the Trainer's parameter groups (no decay on biases and norms)."""
    decay = set(get_parameter_names(stage, [torch.nn.LayerNorm],
                                    ["bias", "layernorm", "rmsnorm", r"(?:^|\.)norm(?:$|\.)", r"_norm(?:$|\.)"]))
    params = [(n, p) for n, p in stage.named_parameters() if p.requires_grad]
    groups = [
        {"params": [p for n, p in params if n in decay], "weight_decay": recipe.train.weight_decay},
        {"params": [p for n, p in params if n not in decay], "weight_decay": 0.0},
    ]
    spec = recipe.train.optimizer  # preflight refuses every kind but adamw here; its betas and eps apply
    return torch.optim.AdamW(groups, lr=recipe.train.learning_rate, betas=tuple(spec.betas), eps=spec.eps)


def _scheduler(optimizer, recipe: Recipe, max_steps: int):
    train = recipe.train
    name = train.scheduler if train.scheduler != "constant" else "constant_with_warmup"
    warmup = int(train.warmup_ratio) if train.warmup_ratio >= 1 else math.ceil(max_steps * train.warmup_ratio)
    return transformers.get_scheduler(name, optimizer, num_warmup_steps=warmup, num_training_steps=max_steps)


class Batches:
    """The Trainer's order: a random permutation seeded with seed + epoch, cut into micro_batch
    batches; replica r takes batches r, r + d, ... and each step joins grad_accum of them. Every step
    batch is padded to micro_batch x grad_accum rows of max_seq_len tokens (pad rows carry no labels),
    so each stage's buffers keep one shape."""

    def __init__(self, dataset, collate, recipe: Recipe, replicas: int, pad_id: int):
        train = recipe.train
        self.dataset, self.collate, self.pad_id = dataset, collate, pad_id
        self.micro, self.accum, self.replicas = train.micro_batch, train.grad_accum, replicas
        self.seq, self.seed = train.max_seq_len, train.seed
        per_replica = math.ceil(math.ceil(len(dataset) / self.micro) / replicas)
        self.steps_per_epoch = max(1, math.ceil(per_replica / self.accum))

    def rows(self) -> int:
        return self.micro * self.accum

    def step(self, step: int, replica: int) -> dict:
        """The batch of 0-based `step` (epochs follow each other) for `replica`."""
        epoch, within = divmod(step, self.steps_per_epoch)
        generator = torch.Generator()
        generator.manual_seed(self.seed + epoch)
        order = torch.randperm(len(self.dataset), generator=generator).tolist()
        batches = [order[i:i + self.micro] for i in range(0, len(order), self.micro)]
        indices = []
        for k in range(self.accum):
            position = (within * self.accum + k) * self.replicas + replica
            if position < len(batches):
                indices += batches[position]
        return self.padded([self.dataset[i] for i in indices], self.rows())

    def padded(self, examples: list[dict], rows: int) -> dict:
        ids = torch.full((rows, self.seq), self.pad_id, dtype=torch.long)
        labels = torch.full((rows, self.seq), IGNORE, dtype=torch.long)
        tokens = 0
        if examples:
            batch = self.collate([{"input_ids": e["input_ids"], "labels": e["labels"]} for e in examples])
            n, length = batch["input_ids"].shape
            length = min(length, self.seq)
            ids[:n, :length] = batch["input_ids"][:, :length]
            labels[:n, :length] = batch["labels"][:, :length]
            tokens = sum(min(len(e["input_ids"]), self.seq) for e in examples)
        return {"input_ids": ids, "labels": labels, "tokens": tokens}

    def eval_batches(self, dataset, replica: int):
        rows = self.rows()
        starts = list(range(0, len(dataset), rows))
        for start in starts[replica::self.replicas]:
            yield self.padded([dataset[i] for i in range(start, min(start + rows, len(dataset)))], rows)
        if len(starts[replica::self.replicas]) < math.ceil(len(starts) / self.replicas):
            yield self.padded([], rows)  # every replica runs as many schedules


def _collator(recipe: Recipe, tokenizer):
    from transformers import DataCollatorForSeq2Seq, default_data_collator

    from tuiapp.trainer.dataset.data import is_pretrain

    if is_pretrain(recipe):
        return default_data_collator
    tokenizer.padding_side = "right"  # causal attention then needs no mask (module docstring)
    return DataCollatorForSeq2Seq(tokenizer, padding="longest", label_pad_token_id=IGNORE)


class PipelineRun:
    def __init__(self, run_dir: Path, recipe: Recipe, resume: bool):
        self.run_dir, self.recipe, self.resume = run_dir, recipe, resume
        self.ckpt_root = RunDir(run_dir).checkpoints
        self.stopper = GracefulStop()
        self.recorder = RunRecorder(run_dir, socket.gethostname())
        self.sample_model = None
        self.tokens_seen = 0
        self.step_count = 0

    # ------------------------------------------------------------ setup

    def setup(self) -> None:
        recipe = self.recipe
        model_path = resolve_model_path(recipe.model.name)  # before the process group (see run.train)
        self.model_path = model_path
        phases.enter("joining ranks")
        self.device = _device()
        dist.init_process_group("nccl" if self.device.type == "cuda" else "gloo")
        self.topo = Topology(recipe.launch.pipeline_stages, self.device)
        phases.enter("loading tokenizer")
        self.tokenizer = load_tokenizer(model_path, recipe.model.trust_remote_code, recipe)
        from tuiapp.trainer.dataset.data import build_datasets

        phases.enter("tokenizing")
        self.train_set, self.eval_set = build_datasets(recipe, self.tokenizer, cache_dir())
        self.batches = Batches(self.train_set, _collator(recipe, self.tokenizer), recipe, self.topo.replicas,
                               self.tokenizer.pad_token_id)
        train = recipe.train
        self.max_steps = train.max_steps or math.ceil(train.epochs * self.batches.steps_per_epoch)
        last = self._resume_state() if self.resume else None
        if self.topo.rank == 0:
            checkpoints.clear_staging(self.ckpt_root)
        transformers.set_seed(train.seed)
        phases.enter("loading model")
        model = load_model(recipe, model_path, "fp32")
        if train.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()
        self.config = model.config
        self.split = split_layers(model.config.to_dict(), self.topo.stages)
        self.recorder.on_train_begin(self._args(), self._state(), None, model=model)  # the whole model's size
        self.recorder.event(self._state(), {
            "event": ev.PIPELINE, "step": self.step_count, "stages": self.topo.stages, "replicas": self.topo.replicas,
            "microbatches": recipe.launch.microbatches, "schedule": recipe.launch.pipeline_schedule,
            "split": [[s.first_layer, s.last_layer, s.params] for s in self.split],
        })
        self.stage = cut(model, self.topo.stages, self.topo.stage).to(self.device)
        self.stage.autocast = torch.bfloat16 if _precision(recipe) == "bf16" else None
        del model
        self.optimizer = _optimizer(self.stage, recipe)
        self.scheduler = _scheduler(self.optimizer, recipe, self.max_steps)
        if last is not None:
            weights = stage_ckpt.load_stage(stage_ckpt.stage_dir(last, self.topo.stage), self.optimizer,
                                            self.scheduler)
            load_hf_state_dict(self.stage, weights)
        self.loss = CausalLoss()
        pipe = PipelineStage(self.stage, self.topo.stage, self.topo.stages, self.device, group=self.topo.pp_group)
        kind = ScheduleGPipe if recipe.launch.pipeline_schedule == "gpipe" else Schedule1F1B
        self.schedule = kind(pipe, recipe.launch.microbatches, loss_fn=self.loss, scale_grads=False)

    def _resume_state(self) -> Path | None:
        """The last complete checkpoint (its step and tokens taken, later metric rows dropped), or None."""
        last = checkpoints.last_checkpoint(self.ckpt_root)
        if last is None:
            return None
        state = stage_ckpt.read_state(last)
        if state.get("pipeline_stages") != self.topo.stages:
            raise RuntimeError(f"{last.name} was saved with {state.get('pipeline_stages')} pipeline stages, the "
                               f"recipe asks for {self.topo.stages}; resume with launch.pipeline_stages = "
                               f"{state.get('pipeline_stages')}")
        self.step_count = int(state["global_step"])
        self.tokens_seen = int(state.get("num_input_tokens_seen", 0))
        if self.topo.rank == 0:
            from tuiapp.trainer.loop.resume import trim_metrics

            trim_metrics(self.run_dir, self.step_count)
        return last

    # ------------------------------------------------------------ the recorder's view

    def _state(self) -> SimpleNamespace:
        return SimpleNamespace(is_world_process_zero=self.topo.rank == 0, global_step=self.step_count,
                               max_steps=self.max_steps, num_input_tokens_seen=self.tokens_seen,
                               epoch=self.step_count / self.batches.steps_per_epoch)

    def _args(self) -> SimpleNamespace:
        # samples per step = train_batch_size x world_size in RunRecorder: micro_batch x grad_accum per replica
        rows = self.batches.rows() * self.topo.replicas / self.topo.world
        return SimpleNamespace(world_size=self.topo.world, train_batch_size=rows, device=self.device)

    # ------------------------------------------------------------ one step

    def _all_reduce(self, tensor: torch.Tensor, group) -> torch.Tensor:
        if group is not None and dist.get_world_size(group) > 1:
            dist.all_reduce(tensor, group=group)
        return tensor

    def train_step(self) -> tuple[float, float, int, float]:
        batch = self.batches.step(self.step_count, self.topo.replica)
        ids, labels = batch["input_ids"].to(self.device), batch["labels"].to(self.device)
        count = self._all_reduce((labels[:, 1:] != IGNORE).sum().float(), self.topo.dp_group)
        self.loss.scale = 1.0 / max(count.item(), 1.0)
        losses: list[torch.Tensor] = []
        args = (ids,) if self.topo.first else ()
        target = labels if self.topo.last else None
        self.schedule.step(*args, target=target, losses=losses if self.topo.last else None, return_outputs=False)
        self._sync_gradients()
        grad_norm = self._clip()
        lr = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        loss = torch.tensor([sum(x.item() for x in losses) if self.topo.last else 0.0], device=self.device)
        self._all_reduce(loss, self.topo.dp_group)
        self._all_reduce(loss, self.topo.pp_group)  # from the last stage to every stage (rank 0 writes)
        tokens = torch.tensor([float(batch["tokens"])], device=self.device)
        self._all_reduce(tokens, self.topo.dp_group)
        return loss.item(), grad_norm, int(tokens.item()), lr

    def _sync_gradients(self) -> None:
        head = tied_head(self.stage)
        if head is not None and self.topo.tied_group is not None and head.grad is not None:
            dist.all_reduce(head.grad, group=self.topo.tied_group)  # both copies get the whole gradient
        if self.topo.replicas > 1:
            grads = [p.grad for p in self.stage.parameters() if p.grad is not None]
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, group=self.topo.dp_group)
            offset = 0
            for g in grads:
                g.copy_(flat[offset:offset + g.numel()].view_as(g))
                offset += g.numel()

    def _clip(self) -> float:
        """The global gradient norm (before clipping), each weight counted once, then clipping."""
        skip = tied_head(self.stage) if self.topo.last and self.topo.stages > 1 else None
        grads = [p.grad for p in self.stage.parameters() if p.grad is not None]
        square = sum((g.float().pow(2).sum() for p, g in ((p, p.grad) for p in self.stage.parameters())
                      if g is not None and p is not skip), torch.zeros((), device=self.device))
        square = self._all_reduce(square.reshape(1), self.topo.pp_group)
        norm = float(square.sqrt().item())
        max_norm = self.recipe.train.max_grad_norm
        if max_norm > 0:
            coef = min(max_norm / (norm + 1e-6), 1.0)
            for g in grads:
                g.mul_(coef)
        return norm

    # ------------------------------------------------------------ eval, samples, saving

    def evaluate(self) -> None:
        totals = torch.zeros(2, device=self.device)  # summed loss, tokens
        self.stage.eval()
        self.loss.scale = 1.0
        with torch.no_grad():
            for batch in self.batches.eval_batches(self.eval_set, self.topo.replica):
                ids, labels = batch["input_ids"].to(self.device), batch["labels"].to(self.device)
                losses: list[torch.Tensor] = []
                args = (ids,) if self.topo.first else ()
                self.schedule.eval(*args, target=labels if self.topo.last else None,
                                   losses=losses if self.topo.last else None)
                if self.topo.last:
                    totals[0] += sum(x.item() for x in losses)
                    totals[1] += (labels[:, 1:] != IGNORE).sum()
        self.stage.train()
        self._all_reduce(totals, self.topo.dp_group)
        self._all_reduce(totals, self.topo.pp_group)
        loss = (totals[0] / totals[1].clamp(min=1)).item()
        if self.recipe.train.sample_prompts:
            self._samples()
        self.recorder.on_evaluate(self._args(), self._state(), None, metrics={"eval_loss": loss})

    def _gather_weights(self) -> dict | None:
        """The whole model's weights on rank 0 (from the first replica's stages); None elsewhere."""
        if self.topo.replica != 0:
            return None
        mine = hf_state_dict(self.stage)
        gathered = [None] * self.topo.stages if self.topo.rank == 0 else None
        if self.topo.stages > 1:
            dist.gather_object(mine, gathered, dst=0, group=self.topo.pp_group)
        else:
            gathered = [mine]
        if self.topo.rank != 0:
            return None
        weights: dict = {}
        for part in gathered:
            for name, tensor in part.items():
                weights.setdefault(name, tensor)
        return weights

    def _samples(self) -> None:
        """The sample prompts answered by the whole model, put together on rank 0's CPU."""
        weights = self._gather_weights()
        if weights is None:
            return
        self.sample_model = stage_ckpt.whole_model(self.config, weights)
        self.recorder.samples = generate_samples(self.sample_model, self.tokenizer, self.recipe.train.sample_prompts,
                                                 self.recipe.train.sample_max_new_tokens)

    def save_checkpoint(self) -> None:
        root, step = self.ckpt_root, self.step_count
        staging = root / checkpoints.STAGING / f"checkpoint-{step}"
        if self.topo.replica == 0:
            stage_ckpt.save_stage(stage_ckpt.stage_dir(staging, self.topo.stage), hf_state_dict(self.stage),
                                  self.optimizer, self.scheduler)
        dist.barrier()
        if self.topo.rank == 0:
            self.config.save_pretrained(staging)
            self.tokenizer.save_pretrained(staging)
            stage_ckpt.write_state(staging, {
                "global_step": step, "max_steps": self.max_steps, "epoch": self._state().epoch,
                "num_input_tokens_seen": self.tokens_seen, "pipeline_stages": self.topo.stages,
                "log_history": [],
            })
            stage_ckpt.publish(root, step, self.recipe.train.save_total_limit)
        dist.barrier()
        self.recorder.on_save(self._args(), self._state(), None)

    def save_final(self) -> None:
        weights = self._gather_weights()
        if self.topo.rank == 0:
            staging, final = RunDir(self.run_dir).final_staging, RunDir(self.run_dir).final
            shutil.rmtree(staging, ignore_errors=True)
            stage_ckpt.whole_model(self.config, weights).save_pretrained(staging)
            self.tokenizer.save_pretrained(staging)
            keep_sentencepiece(staging, self.model_path)
            info = {"method": self.recipe.method.kind, "weights": self.recipe.method.kind,
                    "base_model": str(self.model_path), "recipe_name": self.recipe.name, "step": self.step_count,
                    "strategy": "pipeline"}
            (staging / FINAL_INFO).write_text(json.dumps(info, indent=2))
            if final.exists():
                shutil.rmtree(final)
            os.replace(staging, final)
        dist.barrier()

    # ------------------------------------------------------------ the loop

    def stop_requested(self) -> bool:
        flag = torch.tensor([1.0 if self.stopper.requested else 0.0], device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return flag.item() > 0

    def run(self) -> int:
        self.setup()
        train = self.recipe.train
        while self.step_count < self.max_steps:
            loss, grad_norm, tokens, lr = self.train_step()
            self.step_count += 1
            self.tokens_seen += tokens
            state = self._state()
            self.recorder.on_step_end(self._args(), state, None)
            if self.step_count % train.logging_steps == 0 or self.step_count == 1:
                self.recorder.on_log(self._args(), state, None, logs={
                    "loss": loss, "learning_rate": lr, "grad_norm": grad_norm, "epoch": state.epoch})
            if self.eval_set is not None and train.eval_steps and self.step_count % train.eval_steps == 0:
                self.evaluate()
            if train.save_steps and self.step_count % train.save_steps == 0:
                self.save_checkpoint()
            if self.stop_requested() and self.step_count < self.max_steps:
                if not (train.save_steps and self.step_count % train.save_steps == 0):
                    self.save_checkpoint()
                self.recorder.event(self._state(), {"event": ev.STOP_CHECKPOINT, "step": self.step_count})
                return 0
        if self.eval_set is not None and not train.eval_steps:
            self.evaluate()
        self.save_final()
        self.recorder.event(self._state(), {"event": ev.FINISHED, "step": self.step_count})
        return 0


def train(run_dir: Path, resume: bool) -> int:
    run_dir = Path(run_dir).resolve()
    recipe = frozen_recipe(run_dir)
    transformers.logging.set_verbosity_warning()
    try:
        return PipelineRun(run_dir, recipe, resume).run()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()

