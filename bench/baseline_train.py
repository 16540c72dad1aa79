"""The baseline: a plain transformers Trainer + DeepSpeed script, as the HF and DeepSpeed docs
show it, for the side-by-side training benchmark (bench/bench_train.py).

    deepspeed --num_gpus 1 bench/baseline_train.py --task sft --model DIR --data FILE --out DIR

What it does is what the docs do, with their defaults:
  * data: `datasets.load_dataset("json", ...)` + `.map(tokenize)` (cached by datasets);
  * pretrain: `tokenizer(text, truncation=True, max_length=L)`, DataCollatorForLanguageModeling
    (mlm=False): padded to the longest in the batch, labels -100 on padding;
  * SFT: the tokenizer's chat template; labels -100 on the prompt (everything before the
    assistant turn), DataCollatorForSeq2Seq padding to the longest in the batch; no packing;
  * `TrainingArguments(..., deepspeed=ds_config)` with a docs-style config ("auto" values).

Added for measurement only (nothing that changes the training):
  * a Trainer subclass that counts non-padding tokens from each batch's attention mask;
  * a callback that appends {step, time, tokens, loss} rows and a `first_step` event to
    OUT/bench_metrics.jsonl / OUT/bench_events.jsonl (rank 0).

One CPU-only necessity for more than one rank (the same one llmtui's trainer has, see
tuiapp/trainer/run.py:prepare_cpu_distributed): without CUDA, accelerate does not set up
DeepSpeed's process group for several ranks (DeepSpeed then fails its batch-size check), so
with WORLD_SIZE > 1 on CPU the script starts it on gloo before building the TrainingArguments.
With one rank (what the benchmark runs) or on GPUs those lines do nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
from datasets import load_dataset
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    DataCollatorForLanguageModeling,
    DataCollatorForSeq2Seq,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

IGNORE = -100


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--task", choices=["pretrain", "sft"], required=True)
    p.add_argument("--model", required=True, help="HF model folder (config + tokenizer)")
    p.add_argument("--data", required=True, help=".jsonl of {text} (pretrain) or .json alpaca (sft)")
    p.add_argument("--out", required=True)
    p.add_argument("--max-steps", type=int, default=60)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=float, default=0.03, help="warmup as a fraction of the steps")
    p.add_argument("--max-seq-len", type=int, default=512)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--zero-stage", type=int, default=0)
    p.add_argument("--precision", choices=["auto", "fp32", "bf16", "fp16"], default="auto",
                   help="auto: bf16 on CUDA that supports it, else fp16 on CUDA, fp32 on CPU (as llmtui)")
    p.add_argument("--local_rank", "--local-rank", type=int, default=-1)
    return p.parse_args()


# ------------------------------------------------------------------ data (docs style)


def pretrain_dataset(tokenizer, data_file: str, max_len: int):
    raw = load_dataset("json", data_files=data_file, split="train")

    def tokenize(batch):
        return tokenizer(batch["text"], truncation=True, max_length=max_len)

    return raw.map(tokenize, batched=True, remove_columns=raw.column_names)


def sft_dataset(tokenizer, data_file: str, max_len: int):
    raw = load_dataset("json", data_files=data_file, split="train")

    def tokenize(example):
        user = example["instruction"]
        if (example.get("input") or "").strip():
            user += "\n" + example["input"]
        prompt = [{"role": "user", "content": user}]
        full = prompt + [{"role": "assistant", "content": example["output"]}]
        prompt_ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True,
                                                   return_dict=False)
        input_ids = tokenizer.apply_chat_template(full, tokenize=True, return_dict=False)
        labels = [IGNORE] * len(prompt_ids) + input_ids[len(prompt_ids):]
        input_ids, labels = input_ids[:max_len], labels[:max_len]
        return {"input_ids": input_ids, "attention_mask": [1] * len(input_ids), "labels": labels}

    dataset = raw.map(tokenize, remove_columns=raw.column_names)
    return dataset.filter(lambda e: any(label != IGNORE for label in e["labels"]))


# ------------------------------------------------------------------ measurement only


class TokenCountingTrainer(Trainer):
    """Counts the non-padding tokens of every micro batch from its attention mask."""

    bench_tokens = 0  # non-padding tokens (attention mask)
    bench_padded = 0  # every token position, padding included

    def training_step(self, model, inputs, num_items_in_batch=None):
        self.bench_tokens += int(inputs["attention_mask"].sum())
        self.bench_padded += inputs["attention_mask"].numel()
        return super().training_step(model, inputs, num_items_in_batch)


class BenchRecorder(TrainerCallback):
    """Rank 0: a {step, time, tokens} row per optimizer step, the loss per log, first_step."""

    def __init__(self, out: str, trainer_ref: list):
        self.out = out
        self.trainer_ref = trainer_ref
        self.metrics = self.events = None
        self.first = False

    def _write(self, handle, record):
        handle.write(json.dumps(record) + "\n")
        handle.flush()

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.metrics = open(os.path.join(self.out, "bench_metrics.jsonl"), "a")
            self.events = open(os.path.join(self.out, "bench_events.jsonl"), "a")
            self._write(self.events, {"event": "started", "time": time.time(),
                                      "threads": str(torch.get_num_threads())})

    def on_step_end(self, args, state, control, **kwargs):
        if self.metrics is None:
            return
        now = time.time()
        if not self.first:
            self.first = True
            self._write(self.events, {"event": "first_step", "time": now, "step": state.global_step})
        trainer, world = self.trainer_ref[0], max(1, args.world_size)  # ranks see alike batches
        self._write(self.metrics, {"step": state.global_step, "time": now,
                                   "tokens": trainer.bench_tokens * world, "padded": trainer.bench_padded * world})

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.metrics is not None and logs and "loss" in logs:
            self._write(self.metrics, {"step": state.global_step, "loss": logs["loss"], "log": True})

    def on_train_end(self, args, state, control, **kwargs):
        if self.events is not None:
            self._write(self.events, {"event": "finished", "time": time.time(), "step": state.global_step})


# ------------------------------------------------------------------ main


def main():
    args = parse_args()
    os.makedirs(args.out, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token

    if args.task == "pretrain":
        train_set = pretrain_dataset(tokenizer, args.data, args.max_seq_len)
        collator = DataCollatorForLanguageModeling(tokenizer, mlm=False)
        torch.manual_seed(args.seed)
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(args.model))
    else:
        train_set = sft_dataset(tokenizer, args.data, args.max_seq_len)
        collator = DataCollatorForSeq2Seq(tokenizer, padding="longest", label_pad_token_id=IGNORE)
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)

    ds_config = {
        "train_micro_batch_size_per_gpu": "auto",
        "train_batch_size": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "bf16": {"enabled": "auto"},
        "fp16": {"enabled": "auto"},
        "zero_optimization": {"stage": args.zero_stage},
    }
    extra = {}
    if not torch.cuda.is_available() and int(os.environ.get("WORLD_SIZE", "1")) > 1:  # see the docstring
        import accelerate

        os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"
        accelerate.PartialState(backend="gloo")
        extra["accelerator_config"] = {"use_configured_state": True}

    precision = args.precision
    if precision == "auto":
        cuda = torch.cuda.is_available()
        precision = ("bf16" if torch.cuda.is_bf16_supported() else "fp16") if cuda else "fp32"
    training_args = TrainingArguments(
        output_dir=os.path.join(args.out, "checkpoints"),
        per_device_train_batch_size=args.micro_batch,
        gradient_accumulation_steps=args.grad_accum,
        learning_rate=args.lr,
        lr_scheduler_type="cosine",
        warmup_steps=args.warmup,
        max_steps=args.max_steps,
        seed=args.seed,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        bf16=precision == "bf16",
        fp16=precision == "fp16",
        deepspeed=ds_config,
        **extra,
    )
    trainer_ref: list = []
    trainer = TokenCountingTrainer(
        model=model,
        args=training_args,
        train_dataset=train_set,
        data_collator=collator,
        processing_class=tokenizer,
        callbacks=[BenchRecorder(args.out, trainer_ref)],
    )
    trainer_ref.append(trainer)
    trainer.train()
    trainer.save_model(os.path.join(args.out, "final"))


if __name__ == "__main__":
    main()
