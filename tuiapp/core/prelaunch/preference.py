"""Pre-flight rules of the preference methods (dpo, simpo, cpo, orpo, kto, reward): the data they
need, and their adapter's rules, which are those of the lora/dora/qlora method it names."""

from __future__ import annotations

from tuiapp.core.common.findings import Finding
from tuiapp.core.common.methods import METHODS, is_preference, is_quantized, is_trl
from tuiapp.core.config.recipe import Recipe, weights_method
from tuiapp.core.machine.gpus import cuda_available
from tuiapp.core.prelaunch.machine_rules import machine_rules
from tuiapp.core.prelaunch.recipe_rules import check_method

PAIR_EXAMPLE = ("records with a prompt and two answers: sharegpt {conversations, chosen, rejected}, messages "
                "{messages, chosen, rejected}, or prompt/chosen/rejected (demo:prefs)")
FEEDBACK_EXAMPLE = "records with one answer and a boolean label: messages {messages, label} (demo:feedback)"


def data_findings(recipe: Recipe, record_kind: str, source: str) -> list[Finding]:
    """Whether the records (datasets.record_kind: text, chat, pairs, unpaired) suit the method."""
    kind = recipe.method.kind
    if METHODS[kind].unpaired:
        if record_kind == "unpaired":
            return []
        what = {"pairs": "chosen/rejected pairs", "chat": "conversations without a label",
                "text": "plain text"}[record_kind]
        fix = f"use {FEEDBACK_EXAMPLE}"
        fix += ", or method.kind = 'dpo' to train on the pairs" if record_kind == "pairs" else ""
        return [Finding("error", "dataset.name", f"{kind} trains on answers labelled good or bad, but {source} "
                        f"holds {what}", fix)]
    if is_preference(kind):
        if record_kind == "pairs":
            return []
        what = {"unpaired": "single answers with a label, not pairs", "chat": "conversations without "
                "chosen/rejected answers (SFT data)", "text": "plain text"}[record_kind]
        fix = f"use {PAIR_EXAMPLE}"
        fix += ", or method.kind = 'kto' for labelled answers" if record_kind == "unpaired" else \
            ", or an SFT method (sft, lora, ...) for this data"
        return [Finding("error", "dataset.name", f"{kind} trains on preference pairs, but {source} holds {what}",
                        fix)]
    if record_kind in ("pairs", "unpaired"):
        what = "preference pairs" if record_kind == "pairs" else "answers labelled good or bad"
        alternative = "'dpo' (or simpo, cpo, orpo, reward)" if record_kind == "pairs" else "'kto'"
        return [Finding("error", "dataset.name", f"{source} holds {what}, which method '{kind}' does not train on",
                        f"set method.kind = {alternative}, or use instruction/chat data")]
    return []


def rules(recipe: Recipe) -> list[Finding]:
    """Cross-field rules of a preference recipe that hold on any machine."""
    method = recipe.method
    if not is_preference(method.kind):
        return []
    out: list[Finding] = []
    if recipe.train.packing is True:
        out.append(Finding("warning", "train.packing", f"{method.kind} batches hold whole chosen/rejected "
                           "sequences side by side, so packing does not apply", "set train.packing = 'auto'"))
    if METHODS[method.kind].unpaired and recipe.train.micro_batch != "auto" and recipe.train.micro_batch < 2:
        out.append(Finding("error", "train.micro_batch", "kto estimates its KL term from the other answers of "
                           "a micro batch, so it needs at least 2", "set train.micro_batch = 2 or more"))
    weights = weights_method(method)
    if is_quantized(weights.kind) and recipe.launch.zero_stage == 3:
        out.append(Finding("error", "launch.zero_stage", "ZeRO-3 cannot partition the 4-bit base weights of a "
                           "qlora adapter", "set launch.zero_stage = 2 or lower"))
    return out


def adapter_findings(recipe: Recipe, model_config: dict | None, cuda: bool | None = None) -> list[Finding]:
    """The checks of the [method.adapter] table's own method (qlora needs CUDA and bitsandbytes,
    target_modules must match the model), reported under method.adapter."""
    if not is_trl(recipe.method.kind) or recipe.method.adapter is None:
        return []
    view = recipe.model_copy(update={"method": recipe.method.adapter})
    found = machine_rules(view, cuda=cuda_available() if cuda is None else cuda)
    if model_config is not None:
        found += check_method(view, model_config)
    out = []
    for f in found:
        if f.key and f.key.startswith("method."):
            fix = (f.fix or "").replace("method.", "method.adapter.") or None
            out.append(Finding(f.level, "method.adapter." + f.key[len("method."):], f.message, fix))
    return out
