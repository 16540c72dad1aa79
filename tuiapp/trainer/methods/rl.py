"""Online RL on TRL's trainers: grpo (GRPOTrainer) and rloo (RLOOTrainer).

Prompts come from `tuiapp.core.prelaunch.rl.prompt_records` (one reading of the data for pre-flight and the
ranks); the completions are generated in each rank with transformers' `generate` (or vLLM,
colocated, on CUDA) and scored by the recipe's rewards: the built-in ones of `tuiapp.core.config.rewards`,
the user's `FILE.py:NAME` (imported here, in the ranks only), or a sequence-classification model.

Every generation is appended to the run folder's completions.jsonl by rank 0 (step, prompt,
completion, each reward, the weighted total, the advantage, its token count); TRL's metrics
(rewards/NAME/mean and std, reward, completions/*, kl, entropy, clip_ratio/*) reach metrics.jsonl
through the run's RunRecorder like any other logged value.
"""

from __future__ import annotations

import json
import os
import traceback
from pathlib import Path

import torch

from tuiapp.core.common.methods import is_lora, is_quantized
from tuiapp.core.config import rewards as builtin
from tuiapp.core.config.recipe import Recipe, weights_method
from tuiapp.core.plan import generation_server
from tuiapp.core.prelaunch import rl as core_rl
from tuiapp.core.run_folder import events as ev
from tuiapp.core.run_folder.atomic import atomic_write_text
from tuiapp.core.run_folder.metrics import JsonlWriter, read_jsonl
from tuiapp.core.run_folder.rundir import RunDir
from tuiapp.trainer.dataset.data import bounded_eval
from tuiapp.trainer.methods import reward_clock
from tuiapp.trainer.methods.adapters import lora_config
from tuiapp.trainer.methods.environments import import_user_file
from tuiapp.trainer.models.model import load_model

TRL_KWARGS = ("trainer_state", "log_extra", "log_metric", "environments")


class RewardFunctionError(RuntimeError):
    """A user's reward function raised: the message names its file and line."""


# ---------------------------------------------------------------- data


def build_datasets(recipe: Recipe, base_dir: Path):
    """(train, eval or None) as datasets.Dataset of {"prompt": turns, **columns}."""
    from datasets import Dataset, load_dataset

    from tuiapp.core.data import datasets as data

    spec = recipe.dataset
    if data.is_hub_dataset(spec, base_dir):
        rows = list(load_dataset(spec.name, split=spec.split))
        records = core_rl.prompt_records_of(rows, spec, spec.name)
    else:
        records = core_rl.prompt_records(spec, base_dir)
    eval_spec = data.eval_file_spec(spec)
    evals = recipe.train.eval_steps > 0 or bool(recipe.train.sample_prompts)
    train_set, eval_set = Dataset.from_list(records), None
    if eval_spec is not None and evals:
        eval_set = Dataset.from_list(core_rl.prompt_records(eval_spec, base_dir))
    elif data.eval_fraction(spec) > 0 and evals:
        parts = train_set.train_test_split(test_size=data.eval_fraction(spec), seed=recipe.train.seed)
        train_set, eval_set = parts["train"], parts["test"]
    if eval_set is not None:  # train.eval_max_samples: the same random subset at every eval
        eval_set = bounded_eval(eval_set, recipe, shuffle=True)
    return train_set, eval_set


# ---------------------------------------------------------------- models


def load_policy(recipe: Recipe, path: str, precision: str):
    """(policy, peft config or None): every weight, or the [method.adapter] TRL wraps."""
    weights = weights_method(recipe.method)
    policy = load_model(recipe.model_copy(update={"method": weights}), path, precision)
    policy.config.use_cache = True  # no packed rows here; generation keeps its KV cache
    if is_quantized(weights.kind):
        import peft

        policy = peft.prepare_model_for_kbit_training(
            policy, use_gradient_checkpointing=recipe.train.gradient_checkpointing)
    peft_config = lora_config(weights, "CAUSAL_LM") if is_lora(weights.kind) else None
    return policy, peft_config


def _reward_model(spec, trust_remote_code: bool):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    folder = Path(spec.model)
    if (folder / "adapter_config.json").exists():  # a `reward` run trained with an adapter
        from peft import AutoPeftModelForSequenceClassification

        model = AutoPeftModelForSequenceClassification.from_pretrained(spec.model, num_labels=1).merge_and_unload()
    else:
        model = AutoModelForSequenceClassification.from_pretrained(spec.model, num_labels=1,
                                                                   trust_remote_code=trust_remote_code)
    tokenizer = AutoTokenizer.from_pretrained(spec.model, trust_remote_code=trust_remote_code)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.requires_grad_(False)
    model.eval()
    return model, tokenizer


# ---------------------------------------------------------------- rewards


def _text(completion) -> str:
    """What the model wrote: a conversational completion's assistant turns, never a tool's result (a rollout
    that ends on the calculator's output has not answered)."""
    if isinstance(completion, list):  # conversational: [{"role": "assistant", "content": ...}, {"role": "tool"...}]
        return "".join(str(turn.get("content") or "") for turn in completion
                       if isinstance(turn, dict) and turn.get("role", "assistant") == "assistant")
    return str(completion)


def _columns(kwargs: dict) -> dict:
    return {k: v for k, v in kwargs.items() if k not in TRL_KWARGS}


def _builtin_reward(spec, base_dir: Path):
    score = builtin.scorer(spec, base_dir)

    def reward(prompts, completions, completion_ids, **kwargs):
        texts = [_text(c) for c in completions]
        columns = {k: v for k, v in _columns(kwargs).items() if isinstance(v, list) and len(v) == len(texts)}
        rows = [{k: v[i] for k, v in columns.items()} for i in range(len(texts))]
        return score(texts, rows, [len(ids) for ids in completion_ids])

    reward.__name__ = spec.label()
    return reward


def load_user_function(function: str, base_dir: Path):
    path, name = core_rl.function_path(function, base_dir)
    func = getattr(import_user_file(path, "llmtui_rewards_"), name, None)
    if not callable(func):
        raise RewardFunctionError(f"{path} has no function '{name}'")
    return path, func


def _python_reward(spec, base_dir: Path, trainer_ref: list):
    path, func = load_user_function(spec.function, base_dir)

    def fail(message: str, exc: BaseException | None):
        raise RewardFunctionError(message) from exc

    guard = reward_clock.Guard(spec.label(), spec.function, func, path, spec.timeout_s, spec.on_error,
                               spec.bad_steps, fail)

    def reward(prompts, completions, completion_ids, **kwargs):
        texts = [_text(c) for c in completions]
        trainer = trainer_ref[0] if trainer_ref else None
        step = trainer.state.global_step + 1 if trainer is not None else "?"
        try:
            return guard.call(len(texts), step, prompts=prompts, completions=texts, completion_ids=completion_ids,
                              **_columns(kwargs))
        except RewardFunctionError:
            raise
        except Exception as exc:
            where = reward_clock.where(exc, path) or str(path)
            trace = "".join(traceback.format_exception(exc, limit=-3)).rstrip()
            raise RewardFunctionError(f"reward function {spec.function} raised {type(exc).__name__}: {exc} at "
                                      f"{where} (step {step})\n{trace}") from exc

    reward.__name__ = spec.label()
    return reward


def reward_functions(recipe: Recipe, base_dir: Path, trainer_ref: list):
    """(reward funcs or models, their processing classes, weights) in the recipe's order."""
    funcs, classes, weights = [], [], []
    for spec in recipe.method.rewards:
        tokenizer = None
        if spec.kind == "python":
            func = _python_reward(spec, base_dir, trainer_ref)
        elif spec.kind == "model":
            func, tokenizer = _reward_model(spec, recipe.model.trust_remote_code)
        else:
            func = _builtin_reward(spec, base_dir)
        funcs.append(func)
        classes.append(tokenizer)
        weights.append(spec.weight)
    return funcs, classes, weights


# ---------------------------------------------------------------- trainer


def turn_end_ids(tokenizer) -> list[int]:
    """The ids of llmtui's turn-end tokens (templates.END_OF_TURN) that the tokenizer's chat template writes."""
    from tuiapp.trainer.models.templates import END_OF_TURN

    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str):
        return []
    return [tokenizer.convert_tokens_to_ids(end) for end in dict.fromkeys(END_OF_TURN.values())
            if end in template and end in tokenizer.get_vocab()]


def trainer_config(recipe: Recipe, kwargs: dict, stop_ids: list[int] = ()):
    """TRL's GRPOConfig/RLOOConfig. `stop_ids`: the turn ends vLLM stops at too (its SamplingParams; the
    transformers backend reads them from the model's generation config, _OnlineRun)."""
    method = recipe.method
    if method.generation_backend == "vllm" and stop_ids:
        kwargs = {**kwargs, "generation_kwargs": {"stop_token_ids": list(stop_ids)}}
    common = dict(
        kwargs, num_generations=method.num_generations, max_completion_length=method.max_completion_length,
        temperature=method.temperature, top_p=method.top_p, beta=method.beta, epsilon=method.epsilon,
        epsilon_high=method.epsilon_high or None, num_iterations=method.num_iterations,
        mask_truncated_completions=method.mask_truncated_completions,
        reward_weights=[r.weight for r in method.rewards], disable_dropout=True, log_completions=False,
        use_vllm=method.generation_backend == "vllm", **vllm_settings(method),
    )
    if method.kind == "grpo":
        from trl import GRPOConfig

        agent = {"max_tool_calling_iterations": method.max_turns} if (method.tools or method.environment) else {}
        return GRPOConfig(**common, loss_type=method.loss_type, scale_rewards=method.scale_rewards, **agent)
    from trl import RLOOConfig

    return RLOOConfig(**common, normalize_advantages=method.normalize_advantages)


def vllm_settings(method, env: dict | None = None) -> dict:
    """TRL's vLLM keys: a colocated engine, or the run's server (its URL and weight-sync port come
    from the supervisor, tuiapp.core.plan.generation_server)."""
    if method.generation_backend != "vllm" or method.vllm_mode == "colocate":
        return {"vllm_mode": "colocate", "vllm_gpu_memory_utilization": method.vllm_gpu_memory_utilization}
    env = os.environ if env is None else env
    if generation_server.URL_ENV not in env:
        raise RuntimeError("method.vllm_mode is 'server' and the supervisor started no generation server "
                           f"(${generation_server.URL_ENV} is not set)")
    return {"vllm_mode": "server", "vllm_server_base_url": env[generation_server.URL_ENV],
            "vllm_group_port": int(env[generation_server.GROUP_PORT_ENV]),
            "vllm_server_timeout": float(method.vllm_server_timeout_s)}


class _OnlineRun:
    """Writes each generation to completions.jsonl (rank 0), counts the tokens of the step, and on
    resume drops completions past the checkpoint."""

    run_dir: Path | None = None
    reward_labels: list[str] = []
    _completions = None

    def __init__(self, model, *args, processing_class=None, **kwargs):
        """TRL stops a generation at the tokenizer's EOS and the ids the model's generation config declares. A model
        whose config stops only at EOS (a base model given dataset.template, Qwen2.5's base with its own ChatML) ran
        each answer on past its turn's end: the tool call was never cut, the tool's turn followed the run-on text.
        The turn ends of llmtui's templates that the chat template writes are declared too, as inference stops."""
        tokenizer = getattr(processing_class, "tokenizer", processing_class)
        config = getattr(model, "generation_config", None)
        if tokenizer is not None and config is not None:
            stops = config.eos_token_id if isinstance(config.eos_token_id, list) else [config.eos_token_id]
            config.eos_token_id = [t for t in dict.fromkeys([*stops, *turn_end_ids(tokenizer)]) if t is not None]
        super().__init__(model, *args, processing_class=processing_class, **kwargs)

    def _send_telemetry(self):
        return None

    def create_model_card(self, *args, **kwargs):
        return None

    def _track_num_input_tokens(self, inputs):
        return None  # counted per generation below (the inputs here are raw prompt rows)

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        if resume_from_checkpoint and self.run_dir is not None and self.accelerator.is_main_process:
            step = int(Path(resume_from_checkpoint).name.rsplit("-", 1)[-1])
            trim_completions(self.run_dir, step)
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def _get_tool_suffix_ids(self, tool_messages):
        """The tokens between a tool call and the model's next turn (the tool's turn, then the assistant's header).
        TRL cuts the rendered call at the tokenizer's EOS; where a template ends turns with another of the
        generation's stop tokens (ChatML's <|im_end|> beside an <|endoftext|> EOS, as the tiny model has; Llama 3's
        <|eot_id|>), that cut kept the turn's tail ('\n') out of the suffix, and the model saw
        `<|im_end|><|im_start|>tool` where its template, and any SFT on it, writes `<|im_end|>\n<|im_start|>tool`.
        Here the cut is after the last stop token the generation ends a turn with, whichever it is."""
        if self._is_vlm:  # a processor's batched output: TRL's own
            return super()._get_tool_suffix_ids(tool_messages)
        calls = [{"type": "function", "function": {"name": tool_messages[0]["name"], "arguments": {}}}]
        call = [{"role": "user", "content": "dummy"}, {"role": "assistant", "content": "", "tool_calls": calls}]

        def render(messages, generation_prompt):
            return self.processing_class.apply_chat_template(
                messages, add_generation_prompt=generation_prompt, tokenize=True, chat_template=self.chat_template,
                return_dict=False, **self.chat_template_kwargs)

        prefix, full = render(call, False), render(call + tool_messages, True)
        ends = [i for i, token in enumerate(prefix) if token in self.eos_token_ids]
        prefix = prefix[: ends[-1] + 1] if ends else prefix
        if full[: len(prefix)] != prefix:
            raise ValueError("the chat template renders a tool call differently once a tool's result follows it")
        return full[len(prefix):]

    def _generate_and_score_completions(self, inputs):
        from accelerate.utils import gather_object

        guard = getattr(self, "tool_guard", None)
        if guard is not None:
            guard.step = self.state.global_step + 1
        output = super()._generate_and_score_completions(inputs)
        if guard is not None:
            guard.check()  # past method.tool_error_limit: the run fails naming the tool and its file:line
        tokens = output["prompt_mask"].sum() + output["completion_mask"].sum()
        agreement = getattr(self, "step_agreement", None)
        if agreement is not None and self.model.training:
            agreement.add_tokens(tokens.detach().to("cpu", torch.int64))
        lengths = gather_object(output["completion_mask"].sum(dim=1).tolist())
        if self.run_dir is not None and self.log_completions_file and self.accelerator.is_main_process:
            self._write_completions(lengths)
        return output

    log_completions_file = True

    def _write_completions(self, lengths: list[int]) -> None:
        count = len(lengths)
        logs = self._logs
        prompts = list(logs["prompt"])[-count:]
        completions = list(logs["completion"])[-count:]
        advantages = list(logs["advantages"])[-count:]
        scores = {name: list(values)[-count:] for name, values in logs["rewards"].items()}
        weights = [float(w) for w in self.reward_weights.tolist()]
        if self._completions is None:
            self._completions = JsonlWriter(RunDir(self.run_dir).completions)
        training = self.model.training
        step = self.state.global_step + 1 if training else self.state.global_step
        limit = self.args.max_completion_length
        for i in range(len(completions)):
            each = {name: _finite(values[i]) for name, values in scores.items()}
            total = sum(w * v for w, v in zip(weights, each.values(), strict=False) if v is not None)
            record = {"step": step, "prompt": _prompt_text(prompts[i]), "completion": _text(completions[i]),
                      "rewards": each, "reward": total, "advantage": _finite(advantages[i]),
                      "tokens": int(lengths[i]), "clipped": int(lengths[i]) >= limit}
            turns = completion_turns(completions[i])
            if turns:
                record["turns"] = turns
            if not training:
                record["split"] = "eval"
            self._completions.write(record)


def completion_turns(completion) -> list[dict]:
    """A multi-turn completion (TRL's tool loop: assistant turns with tool_calls, tool turns) as
    completions.jsonl's turns; [] for a single turn."""
    if not isinstance(completion, list) or not any(
            isinstance(t, dict) and (t.get("role") == "tool" or t.get("tool_calls")) for t in completion):
        return []
    out = []
    for turn in completion:
        if not isinstance(turn, dict):
            continue
        content = turn.get("content")
        text = content if isinstance(content, str) else json.dumps(content, default=str) if content else ""
        if turn.get("role") == "tool":
            out.append({"role": "tool", "content": (f"{turn['name']}: " if turn.get("name") else "") + text})
            continue
        if text.strip():
            out.append({"role": "model", "content": text})
        for call in turn.get("tool_calls") or []:
            function = call.get("function", call) if isinstance(call, dict) else {}
            arguments = function.get("arguments", {})
            arguments = arguments if isinstance(arguments, str) else json.dumps(arguments, default=str)
            out.append({"role": "tool_call", "content": f"{function.get('name', '?')}({arguments})"})
    return out


def _finite(value):
    value = float(value)
    return value if value == value and abs(value) != float("inf") else None


def _prompt_text(prompt) -> str:
    if isinstance(prompt, list):
        users = [t.get("content", "") for t in prompt if isinstance(t, dict) and t.get("role") == "user"]
        return str(users[-1]) if users else json.dumps(prompt)
    return str(prompt)


def trim_completions(run_dir: Path, step: int) -> None:
    """On resume: drop completions of steps past the checkpoint, so none is counted twice."""
    path = RunDir(run_dir).completions
    if not path.exists():
        return
    kept = [r for r in read_jsonl(path) if (r.get("step") or 0) <= step]
    atomic_write_text(path, "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in kept))


def trainer_class(kind: str, mixins: tuple = ()):
    if kind == "grpo":
        from trl import GRPOTrainer as base
    else:
        from trl import RLOOTrainer as base
    return type(f"{kind.capitalize()}RunTrainer", (*mixins, _OnlineRun, base), {})


def tool_template(tokenizer) -> bool:
    """llmtui's ChatML templates (the bundled tiny model's and dataset.template `chatml`, see models.tiny) write
    tool calls as Qwen does (<tool_call>{"name", "arguments"}</tool_call>), but TRL knows a template's calls by its
    text: such a tokenizer is given TRL's Qwen response parser. True when set."""
    from trl.chat_template_utils import qwen3_template

    from tuiapp.trainer.models.tiny import CHATML_TEMPLATE, TINY_TEMPLATE

    if getattr(tokenizer, "chat_template", None) not in (CHATML_TEMPLATE, TINY_TEMPLATE):
        return False
    tokenizer.response_template = qwen3_template
    return True


def build_trainer(recipe: Recipe, run_dir: Path, model, peft_config, kwargs: dict, train_set, eval_set, tokenizer,
                  callbacks: list, mixins: tuple = ()):
    base_dir = Path(os.getcwd())
    tokenizer.padding_side = "left"  # TRL generates from left-padded prompts
    trainer_ref: list = []
    funcs, classes, _ = reward_functions(recipe, base_dir, trainer_ref)
    config = trainer_config(recipe, kwargs, turn_end_ids(tokenizer))
    cls = trainer_class(recipe.method.kind, mixins)
    guard, agent = None, {}
    if getattr(recipe.method, "tools", None) or getattr(recipe.method, "environment", None):
        from tuiapp.trainer.methods import environments, tool_guard

        method = recipe.method
        tool_template(tokenizer)
        guard = tool_guard.Guard(method.tool_timeout_s, method.tool_output_tokens, method.tool_error_limit,
                                 run_dir, tokenizer)
        agent = environments.trainer_kwargs(recipe, base_dir, guard)
    trainer = cls(model=model, reward_funcs=funcs, args=config, train_dataset=train_set, eval_dataset=eval_set,
                  processing_class=tokenizer, reward_processing_classes=classes, callbacks=callbacks,
                  peft_config=peft_config, **agent)
    trainer.tool_guard = guard
    trainer_ref.append(trainer)
    # TRL names a reward model by its folder: the recipe's labels instead; an environment's own get_reward,
    # which TRL adds after the recipe's rewards, keeps TRL's name (its class)
    labels = [r.label() for r in recipe.method.rewards]
    trainer.reward_func_names = labels + list(trainer.reward_func_names[len(labels):])
    trainer.run_dir = Path(run_dir)
    trainer.log_completions_file = recipe.method.log_completions
    return trainer


def generation_event(recipe: Recipe) -> dict:
    """Which backend generates the completions, for events.jsonl."""
    method = recipe.method
    event = {"event": ev.GENERATION, "backend": method.generation_backend, "num_generations": method.num_generations,
             "max_completion_length": method.max_completion_length,
             "rewards": [{"name": r.label(), "kind": r.kind, "weight": r.weight} for r in method.rewards]}
    if method.generation_backend == "vllm":
        event["vllm_mode"] = method.vllm_mode
        if method.vllm_mode == "colocate":
            event["vllm_gpu_memory_utilization"] = method.vllm_gpu_memory_utilization
        else:
            event.update(vllm_server_gpus=method.vllm_server_gpus,
                         vllm_server=os.environ.get(generation_server.URL_ENV))
    return event


def preview(recipe: Recipe, tokenizer, count: int, as_json: bool, out) -> None:
    """`llmtui data` of a grpo/rloo recipe: each prompt as the policy sees it (chat template and
    generation prompt), and the columns its rewards read; the completions come from the policy."""
    records = core_rl.prompt_records(recipe.dataset, Path.cwd())[:count]
    names = ", ".join(r.label() for r in recipe.method.rewards) or "no reward yet"
    shown = []
    for index, record in enumerate(records):
        text = tokenizer.apply_chat_template(record["prompt"], add_generation_prompt=True, tokenize=False)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        columns = {k: v for k, v in record.items() if k != "prompt"}
        if as_json:
            shown.append(json.dumps({"index": index, "input_ids": ids, "text": text, "columns": columns},
                                    ensure_ascii=False, default=str))
            continue
        out.write(f"── example {index}: prompt of {len(ids)} tokens; the policy writes {recipe.method.num_generations} "
                  f"completions, scored by {names} ──\n{text}\n")
        out.write("columns: " + (", ".join(f"{k}={v!r}" for k, v in columns.items()) or "none") + "\n")
    if as_json:
        out.write("[\n" + ",\n".join(shown) + ("\n]\n" if shown else "]\n"))
