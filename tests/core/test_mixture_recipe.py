"""[[dataset.sources]]: a mixture's recipe keys, their errors, overrides, sweeps and checks."""

from __future__ import annotations

import pytest

from tuiapp.core.common.errors import RecipeError
from tuiapp.core.config.recipe import AUTO_EVAL_SPLIT, parse_recipe, recipe_from_dict
from tuiapp.core.config.sweep import plan_sweep
from tuiapp.core.prelaunch import door
from tuiapp.core.prelaunch.recipe_rules import recipe_rules
from tuiapp.core.store.runs import RunStore

MIX = '''name = "mix"
[method]
kind = "sft"
[dataset]
mix_by = "tokens"
[[dataset.sources]]
name = "demo:facts"
weight = 2
[[dataset.sources]]
name = "demo:chat"
eval_split = 0.1
max_samples = 40
'''


def error_of(text: str) -> RecipeError:
    with pytest.raises(RecipeError) as info:
        parse_recipe(text, "r.toml")
    return info.value


def test_a_mixture_parses_and_round_trips():
    recipe = parse_recipe(MIX)
    facts, chat = recipe.dataset.sources
    assert (facts.key, facts.weight, chat.key, chat.max_samples) == ("facts", 2.0, "chat", 40)
    assert recipe.dataset.mix_by == "tokens"
    assert recipe.dataset.label == "mix(facts:2, chat:1) by tokens"
    specs = recipe.dataset.source_specs()
    assert [(s.name, s.eval_split, s.max_samples) for s in specs] == [("demo:facts", 0.0, 0), ("demo:chat", 0.1, 40)]
    assert parse_recipe(recipe.to_toml()) == recipe


def test_a_recipe_without_sources_is_unchanged():
    recipe = parse_recipe('[method]\nkind = "sft"\n[dataset]\nname = "demo:chat"\n')
    assert recipe.dataset.sources == [] and recipe.dataset.source_specs() == []
    assert recipe.dataset.label == "demo:chat"


def test_an_unknown_source_key_names_its_table_line_and_the_fix():
    err = error_of(MIX.replace("weight = 2", "weigth = 2"))
    assert (err.key, err.line, err.message) == ("dataset.sources.0.weigth", 8, "unknown key 'weigth'")
    assert "weight" in err.fix
    err = error_of(MIX.replace("max_samples = 40", "colums = {}"))
    assert (err.key, err.line) == ("dataset.sources.1.colums", 12) and "columns" in err.fix


@pytest.mark.parametrize("line, key", [
    ('weight = 0', "dataset.sources.0.weight"),
    ('weight = -1', "dataset.sources.0.weight"),
    ('format = "csv"', "dataset.sources.0.format"),
    ('eval_split = 0.9', "dataset.sources.0.eval_split"),
    ('columns = {answer = "a"}', "dataset.sources.0.columns"),
    ('name = ""', "dataset.sources.0.name"),
])
def test_bad_source_values_name_the_key(line, key):
    kept = line if line.startswith("name") else f'name = "demo:facts"\n{line}'
    err = error_of(MIX.replace('name = "demo:facts"\nweight = 2', kept, 1))
    assert err.key == key, err


def test_a_source_needs_a_name():
    err = error_of(MIX.replace('name = "demo:chat"\n', ""))
    assert err.key == "dataset.sources.1.name" and err.fix == "add this key"


def test_mix_by_takes_examples_or_tokens():
    err = error_of(MIX.replace('"tokens"', '"bytes"'))
    assert err.key == "dataset.mix_by" and "'examples'" in err.fix and err.line == 5
    err = error_of('[method]\nkind = "sft"\n[dataset]\nname = "demo:chat"\nmix_by = "tokens"\n')
    assert (err.key, err.line) == ("dataset.mix_by", 5) and "[[dataset.sources]]" in err.fix


@pytest.mark.parametrize("line, key", [
    ('name = "demo:text"', "dataset.name"),
    ('format = "alpaca"', "dataset.format"),
    ('eval_split = 0.2', "dataset.eval_split"),
    ('max_samples = 5', "dataset.max_samples"),
])
def test_single_dataset_keys_beside_sources_are_refused(line, key):
    err = error_of(MIX.replace('mix_by = "tokens"', line))
    assert err.key == key and "together with [[dataset.sources]]" in err.message
    assert "each [[dataset.sources]] table" in err.fix and err.line == 5


def test_two_sources_with_one_label_are_refused():
    err = error_of(MIX.replace("demo:chat", "demo:facts"))
    assert err.key == "dataset.sources.1.label" and "'facts'" in err.message and "label" in err.fix
    recipe = parse_recipe(MIX.replace('name = "demo:chat"', 'name = "demo:facts"\nlabel = "facts2"'))
    assert [s.key for s in recipe.dataset.sources] == ["facts", "facts2"]


def test_evals_hold_out_a_share_of_each_source_without_one():
    recipe = parse_recipe(MIX + "[train]\neval_steps = 5\n")
    assert [s.eval_split for s in recipe.dataset.sources] == [AUTO_EVAL_SPLIT, 0.1]
    assert recipe.dataset.eval_split == 0.0 and recipe.dataset.eval_split_auto
    assert any(f.key == "dataset.eval_split" and f.level == "info" for f in recipe_rules(recipe))
    said = next(f for f in recipe_rules(recipe) if f.key == "dataset.eval_split")
    assert said.message.startswith("5% of each source without an eval_split is held out")  # not "the training data"
    assert said.fix.startswith("set eval_split in the [[dataset.sources]] tables")
    assert parse_recipe(recipe.to_toml()).dataset.sources == recipe.dataset.sources


def test_overrides_and_sweeps_reach_a_source_by_index(tmp_path):
    from tuiapp.core.config.recipe import load_recipe

    path = tmp_path / "mix.toml"
    text = MIX + '[model]\nname = "tiny"\n'  # a recipe file names its model
    path.write_text(text)
    recipe = load_recipe(path, ["dataset.sources.1.weight=3"])
    assert [s.weight for s in recipe.dataset.sources] == [2.0, 3.0]
    for bad, words in (("dataset.sources.7.weight=1", "no item 7"), ("dataset.sources.weight=1", "a list")):
        with pytest.raises(RecipeError) as info:
            load_recipe(path, [bad])
        assert words in info.value.message
    import tomllib

    plan = plan_sweep(tomllib.loads(text), text, str(path), {"dataset.sources.0.weight": [1, 4]})
    assert sorted(c.recipe.dataset.sources[0].weight for c in plan.combinations) == [1.0, 4.0]
    assert len({c.recipe.name for c in plan.combinations}) == 2


def test_mixture_rules_refuse_what_a_mixture_cannot_train():
    base = {"method": {"kind": "sft"}, "dataset": {"sources": [{"name": "demo:facts"}, {"name": "demo:chat"}]}}
    assert not [f for f in recipe_rules(recipe_from_dict(base)) if f.key and f.key.startswith("dataset.")]
    streamed = recipe_from_dict({**base, "dataset": {**base["dataset"], "streaming": True},
                                 "train": {"max_steps": 5}})
    found = {f.key: f for f in recipe_rules(streamed) if f.level == "error"}
    assert "dataset.streaming" in found and "streaming = false" in found["dataset.streaming"].fix
    dpo = recipe_from_dict({**base, "method": {"kind": "dpo"}})
    assert "dataset.sources" in {f.key for f in recipe_rules(dpo) if f.level == "error"}


def test_validation_checks_every_source(tmp_path):
    (tmp_path / "bad.jsonl").write_text('{"foo": "bar"}\n')
    recipe = recipe_from_dict({"method": {"kind": "sft"}, "dataset": {"sources": [
        {"name": "demo:facts"}, {"name": str(tmp_path / "bad.jsonl")}, {"name": str(tmp_path / "gone.jsonl")},
        {"name": "demo:text"}]}})
    found = door.recipe_findings(recipe, RunStore(tmp_path / "runs"), base_dir=tmp_path)
    errors = {f.key: f.message for f in found if f.level == "error"}
    assert set(errors) == {"dataset.sources.1.format", "dataset.sources.2.name", "dataset.sources.3.format"}
    assert errors["dataset.sources.1.format"].startswith("source 'bad': ")
    fixes = {f.key: f.fix for f in found if f.level == "error"}
    assert "set dataset.sources.1.columns" in fixes["dataset.sources.1.format"]
    assert "not found" in errors["dataset.sources.2.name"]
    assert "plain text" in errors["dataset.sources.3.format"]
    good = recipe_from_dict({"method": {"kind": "sft"}, "dataset": {"sources": [{"name": "demo:facts"},
                                                                                 {"name": "demo:chat"}]}})
    assert not [f for f in door.recipe_findings(good, RunStore(tmp_path / "runs"), base_dir=tmp_path)
                if f.level == "error"]


def test_a_mixture_on_a_vision_language_model_is_refused_before_launch(tmp_path):
    """Its rank refused it after launch, once validate had said ok."""
    recipe = recipe_from_dict({"model": {"name": "tiny-vlm"}, "method": {"kind": "lora"}, "dataset": {
        "sources": [{"name": "demo:shapes"}, {"name": "demo:facts"}]}})
    errors = [f for f in door.recipe_findings(recipe, RunStore(tmp_path / "runs"), base_dir=tmp_path)
              if f.level == "error"]
    assert [f.key for f in errors] == ["dataset.sources"]
    assert "vision-language" in errors[0].message and "use one image dataset (dataset.name)" in errors[0].fix


def test_llmtui_eval_defaults_to_the_first_sources_held_out_demo(tmp_path):
    from tuiapp.core.after.evaluation import default_data

    recipe = recipe_from_dict({"method": {"kind": "sft"}, "dataset": {"sources": [
        {"name": "demo:shapes"}, {"name": "demo:facts"}]}})
    (tmp_path / "recipe.toml").write_text(recipe.to_toml())
    assert default_data(tmp_path) == "demo:shapes-heldout"
