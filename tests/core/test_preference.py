"""Preference tuning in core: the method schema, preference data formats, pre-flight rules and the
memory estimate of the reference model (issue 12)."""

import json
from pathlib import Path

import pytest

from tuiapp.core.common.errors import DatasetError, RecipeError
from tuiapp.core.common.methods import PREFERENCE_KINDS
from tuiapp.core.config.recipe import (
    DatasetSpec,
    parse_recipe,
    recipe_from_dict,
    uses_adapter,
    weights_method,
)
from tuiapp.core.data.datasets import inspect_dataset, load_records
from tuiapp.core.plan.estimate import PRESET_CONFIGS, estimate_recipe, format_estimate, reference_bytes
from tuiapp.core.prelaunch import door
from tuiapp.core.store.runs import RunStore

SHARED_DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
ROOT = Path(__file__).resolve().parents[2]
needs_shared = pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="../shared/data is absent")

DPO_LORA = """
name = "d"
[method]
kind = "dpo"
beta = 0.2
loss = "ipo"
[method.adapter]
kind = "lora"
rank = 4
"""


def error_of(text: str) -> RecipeError:
    with pytest.raises(RecipeError) as info:
        parse_recipe(text, "r.toml")
    return info.value


# ---------------------------------------------------------------- schema


def test_dpo_with_an_adapter_reads_naturally_and_round_trips():
    recipe = parse_recipe(DPO_LORA)
    assert (recipe.method.kind, recipe.method.beta, recipe.method.loss) == ("dpo", 0.2, "ipo")
    assert recipe.method.adapter.kind == "lora" and recipe.method.adapter.rank == 4
    assert uses_adapter(recipe) and weights_method(recipe.method).kind == "lora"
    assert parse_recipe(recipe.to_toml()) == recipe


def test_without_an_adapter_every_weight_trains_and_toml_has_no_null():
    recipe = recipe_from_dict({"method": {"kind": "kto"}})
    assert recipe.method.adapter is None and not uses_adapter(recipe)
    assert weights_method(recipe.method).kind == "sft"
    text = recipe.to_toml()
    assert "adapter" not in text and parse_recipe(text) == recipe


@pytest.mark.parametrize("kind", sorted(PREFERENCE_KINDS))
def test_every_preference_kind_takes_every_adapter(kind):
    for adapter in ("lora", "dora", "qlora"):
        recipe = recipe_from_dict({"method": {"kind": kind, "adapter": {"kind": adapter}}})
        assert weights_method(recipe.method).kind == adapter


def test_adapter_errors_name_the_key_and_the_fix():
    error = error_of(DPO_LORA + "rnak = 3\n")
    assert (error.key, error.line) == ("method.adapter.rnak", 10)
    assert "did you mean 'rank'" in error.fix
    error = error_of(DPO_LORA.replace('kind = "lora"', 'kind = "lorra"'))
    assert error.key == "method.adapter.kind" and "unknown adapter kind 'lorra'" in error.message
    assert "did you mean 'lora'" in error.fix
    error = error_of(DPO_LORA.replace('kind = "lora"\n', ""))
    assert error.key == "method.adapter.kind" and "lora, dora, qlora" in error.fix
    error = error_of(DPO_LORA + "quant_type = 'nf4'\n")  # a qlora key on a lora adapter
    assert error.key == "method.adapter.quant_type" and "unknown key" in error.message
    error = error_of(DPO_LORA.replace("rank = 4", "rank = 0"))
    assert error.key == "method.adapter.rank" and "Rank r" in error.fix


def test_method_keys_are_strict():
    error = error_of('[method]\nkind = "dpo"\nloss = "sigmod"\n')
    assert error.key == "method.loss" and "'sigmoid', 'ipo', 'hinge' or 'robust'" in error.fix
    error = error_of('[method]\nkind = "kto"\nloss = "sigmoid"\n')  # kto has no loss variants
    assert error.key == "method.loss" and "unknown key" in error.message
    error = error_of('[method]\nkind = "dpo"\nbeta = 0\n')
    assert error.key == "method.beta"
    error = error_of('[method]\nkind = "dpoo"\n')
    assert "did you mean 'dpo'" in error.fix


# ---------------------------------------------------------------- data


def write(path: Path, records) -> Path:
    path.write_text(json.dumps(records))
    return path


def load(path, **spec):
    return load_records(DatasetSpec(name=str(path), **spec))


def test_trl_explicit_prompt_text_becomes_turns(tmp_path):
    path = write(tmp_path / "p.json", [{"prompt": "Sky?", "chosen": "Blue.", "rejected": "Green."}])
    info = inspect_dataset(DatasetSpec(name=str(path)))
    assert (info.format, info.kind) == ("preference", "pairs")
    assert load(path) == [{"prompt": [{"role": "user", "content": "Sky?"}],
                           "chosen": [{"role": "assistant", "content": "Blue."}],
                           "rejected": [{"role": "assistant", "content": "Green."}], "tools": None}]


def test_trl_implicit_prompt_is_the_shared_start(tmp_path):
    user = {"role": "user", "content": "Sky?"}
    record = {"chosen": [user, {"role": "assistant", "content": "Blue."}],
              "rejected": [user, {"role": "assistant", "content": "Green."}]}
    [pair] = load(write(tmp_path / "i.json", [record]))
    assert pair["prompt"] == [user]
    assert pair["chosen"] == [{"role": "assistant", "content": "Blue."}]


def test_sharegpt_and_messages_pairs(tmp_path):
    sharegpt = {"system": "Be brief.", "conversations": [{"from": "human", "value": "Hi"}],
                "chosen": {"from": "gpt", "value": "Hello."}, "rejected": {"from": "gpt", "value": "Go away."}}
    [pair] = load(write(tmp_path / "s.json", [sharegpt]))
    assert pair["prompt"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert pair["rejected"] == [{"role": "assistant", "content": "Go away."}]
    messages = {"messages": [{"role": "user", "content": "Hi"}], "chosen": "Hello.", "rejected": ["Go away."]}
    path = write(tmp_path / "m.json", [messages])
    assert inspect_dataset(DatasetSpec(name=str(path))).format == "messages"
    [pair] = load(path)
    assert pair["chosen"] == [{"role": "assistant", "content": "Hello."}]


def test_alpaca_pairs_keep_instruction_and_input(tmp_path):
    record = {"instruction": "Add", "input": "2 and 3", "chosen": "5", "rejected": "6"}
    path = write(tmp_path / "a.json", [record])
    info = inspect_dataset(DatasetSpec(name=str(path)))
    assert (info.format, info.kind) == ("alpaca", "pairs")
    [pair] = load(path)
    assert pair["prompt"] == [{"role": "user", "content": "Add\n2 and 3"}]


def test_unpaired_feedback_formats(tmp_path):
    record = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}],
              "label": True}
    [fb] = load(write(tmp_path / "k.json", [record]))
    assert fb == {"prompt": [{"role": "user", "content": "Hi"}],
                  "completion": [{"role": "assistant", "content": "Hello."}], "label": True, "tools": None}
    trl = {"prompt": "Hi", "completion": "Bye.", "label": "false"}
    path = write(tmp_path / "u.json", [trl])
    info = inspect_dataset(DatasetSpec(name=str(path)))
    assert (info.format, info.kind) == ("unpaired", "unpaired")
    assert load(path)[0]["label"] is False
    tagged = {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Yo"}], "kto_tag": 1}
    assert load(write(tmp_path / "t.json", [tagged]))[0]["label"] is True


def test_bad_preference_records_name_the_column_and_the_fix(tmp_path):
    bad_label = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}],
                 "label": "maybe"}
    with pytest.raises(DatasetError) as info:
        load(write(tmp_path / "b.json", [bad_label]))
    assert "'label' must be true or false" in info.value.message and "boolean" in info.value.fix
    answered = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}],
                "chosen": "A", "rejected": "B"}
    with pytest.raises(DatasetError) as info:
        load(write(tmp_path / "c.json", [answered]))
    assert "ends with an assistant turn" in info.value.message and "user's turn" in info.value.fix
    unanswered = {"messages": [{"role": "user", "content": "Hi"}], "label": True}
    with pytest.raises(DatasetError) as info:
        load(write(tmp_path / "d.json", [unanswered]))
    assert "must end with the assistant answer" in info.value.message


def test_demo_preference_sets():
    prefs = inspect_dataset(DatasetSpec(name="demo:prefs"), limit=600)
    assert (prefs.kind, prefs.count) == ("pairs", 600)
    assert all(p["chosen"] != p["rejected"] for p in prefs.examples)
    feedback = inspect_dataset(DatasetSpec(name="demo:feedback"), limit=600)
    assert (feedback.kind, feedback.count) == ("unpaired", 600)
    assert sum(r["label"] for r in feedback.examples) == 300


@needs_shared
def test_shared_samples_are_detected():
    dpo = inspect_dataset(DatasetSpec(name="dpo_en_demo.json"), base_dir=SHARED_DATA)
    assert (dpo.format, dpo.kind, dpo.count) == ("sharegpt", "pairs", 300)
    kto = inspect_dataset(DatasetSpec(name="kto_en_demo.json"), base_dir=SHARED_DATA)
    assert (kto.format, kto.kind, kto.count) == ("messages", "unpaired", 300)
    assert {r["label"] for r in load_records(DatasetSpec(name="kto_en_demo.json"), SHARED_DATA)} == {True, False}


# ---------------------------------------------------------------- pre-flight


def findings(tmp_path, **sections) -> list:
    recipe = recipe_from_dict({"name": "t", **sections})
    return door.recipe_findings(recipe, RunStore(tmp_path / "runs"), base_dir=ROOT)


def errors(found) -> dict:
    return {f.key: f for f in found if f.level == "error"}


def test_dpo_on_sft_data_is_refused_with_the_fix(tmp_path):
    error = errors(findings(tmp_path, dataset={"name": "demo:facts"}, method={"kind": "dpo"}))["dataset.name"]
    assert "dpo trains on preference pairs" in error.message and "demo:facts" in error.message
    assert "chosen" in error.fix and "demo:prefs" in error.fix


def test_kto_on_pairs_and_dpo_on_feedback_are_refused(tmp_path):
    error = errors(findings(tmp_path, dataset={"name": "demo:prefs"}, method={"kind": "kto"}))["dataset.name"]
    assert "labelled good or bad" in error.message and "chosen/rejected pairs" in error.message
    assert "method.kind = 'dpo'" in error.fix
    error = errors(findings(tmp_path, dataset={"name": "demo:feedback"}, method={"kind": "orpo"}))["dataset.name"]
    assert "method.kind = 'kto'" in error.fix


def test_sft_methods_refuse_preference_data(tmp_path):
    error = errors(findings(tmp_path, dataset={"name": "demo:prefs"}, method={"kind": "lora"}))["dataset.name"]
    assert "method.kind = 'dpo'" in error.fix


def test_matching_data_pass(tmp_path):
    assert not errors(findings(tmp_path, dataset={"name": "demo:prefs"}, method={"kind": "simpo"}))
    assert not errors(findings(tmp_path, dataset={"name": "demo:feedback"}, method={"kind": "kto"}))


def test_kto_needs_two_answers_per_micro_batch(tmp_path):
    found = errors(findings(tmp_path, dataset={"name": "demo:feedback"}, method={"kind": "kto"},
                            train={"micro_batch": 1}))
    assert "train.micro_batch" in found


def test_qlora_adapter_rules_are_reported_under_method_adapter(tmp_path):
    recipe = {"dataset": {"name": "demo:prefs"}, "method": {"kind": "dpo", "adapter": {"kind": "qlora"}},
              "launch": {"zero_stage": 3}}
    assert "launch.zero_stage" in errors(findings(tmp_path, **recipe))
    from tuiapp.core.prelaunch.preference import adapter_findings

    found = adapter_findings(recipe_from_dict({"name": "t", **recipe}), None, cuda=False)
    assert [f.key for f in found][0] == "method.adapter.kind"
    assert "method.adapter.kind = 'lora'" in found[0].fix
    targets = recipe_from_dict({"method": {"kind": "dpo", "adapter": {"kind": "lora", "target_modules": ["nope"]}}})
    found = adapter_findings(targets, PRESET_CONFIGS["Qwen/Qwen2.5-0.5B"], cuda=True)
    assert [f.key for f in found] == ["method.adapter.target_modules"]


# ---------------------------------------------------------------- estimate


def estimate(method: dict, **launch):
    recipe = recipe_from_dict({"model": {"name": "Qwen/Qwen2.5-0.5B"}, "method": method,
                               "train": {"max_seq_len": 512, "micro_batch": 2}, "launch": launch})
    return estimate_recipe(recipe, PRESET_CONFIGS["Qwen/Qwen2.5-0.5B"], 2)


def test_full_weight_dpo_counts_a_frozen_reference():
    config = PRESET_CONFIGS["Qwen/Qwen2.5-0.5B"]  # estimates on 2 GPUs
    full = estimate({"kind": "dpo"})
    params = full.total_params
    assert full.memory.reference == params * 2  # bf16 weights, whole on every rank below ZeRO-3
    assert full.trainable_params == params
    assert "reference" in format_estimate(full)
    sharded = estimate({"kind": "dpo"}, zero_stage=3)
    assert sharded.memory.reference == params * 2 // 2  # 2 ranks
    lora = estimate({"kind": "dpo", "adapter": {"kind": "lora"}})
    assert lora.memory.reference == 0 and lora.trainable_params < params / 10
    assert estimate({"kind": "orpo"}).memory.reference == 0  # no reference model
    sft = recipe_from_dict({"model": {"name": "Qwen/Qwen2.5-0.5B"}, "method": {"kind": "sft"},
                            "train": {"max_seq_len": 512, "micro_batch": 2}})
    assert full.memory.activations > estimate_recipe(sft, config, 2).memory.activations  # chosen + rejected
    assert reference_bytes(1000, 3, 4, "cpu", "bf16") == (0, 500)


def test_full_weight_preference_suggests_an_adapter():
    from tuiapp.core.plan.estimate import Knobs, _candidates

    method = recipe_from_dict({"method": {"kind": "dpo"}}).method
    texts = [text for text, _ in _candidates(Knobs(method, 0, "none", "none", False, 1), 1, 1)]
    assert "[method.adapter] kind='lora'" in texts and "method.kind='lora'" not in texts


# ---------------------------------------------------------------- history figures


def test_best_accuracy_and_margin_prefer_eval_rows_else_smoothed_train_rows():
    from tuiapp.core.run_folder.metrics import running_means, summarize
    from tuiapp.ui.history import PreferenceBest

    train = [{"step": s, "loss": 0.6, "rewards/accuracies": a, "rewards/margins": a / 10}
             for s, a in enumerate([0.0, 1.0, 0.0, 1.0, 1.0, 1.0], start=1)]
    assert running_means([0.0, 1.0, 0.0, 1.0], window=2) == [0.0, 0.5, 0.5, 0.5]
    summary = summarize(train)
    assert summary["best_accuracy"] == pytest.approx(4 / 6)  # window 10: the mean so far, at its best
    live = PreferenceBest()
    for row in train:
        live.add(row, "train")
    assert live.best("best_accuracy") == pytest.approx(summary["best_accuracy"])
    evals = [{"split": "eval", "step": 6, "eval_loss": 0.5, "eval_rewards/accuracies": 0.8,
              "eval_rewards/margins": 0.3}]
    summary = summarize(train + evals)
    assert (summary["best_accuracy"], summary["best_margin"]) == (0.8, 0.3)
    live.add(evals[0], "eval")
    assert live.best("best_margin") == 0.3
    assert summarize([{"step": 1, "loss": 1.0}])["best_accuracy"] is None  # not a preference run
