import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tuiapp.core.common.errors import RecipeError, RecipeErrors
from tuiapp.core.config.recipe import METHOD_KINDS, json_schema, load_recipe, parse_recipe


def error_of(text: str) -> RecipeError:
    with pytest.raises(RecipeError) as info:
        parse_recipe(text, "r.toml")
    return info.value


LORA = '[method]\nkind = "lora"\n'


def test_defaults_are_a_valid_recipe():
    recipe = parse_recipe(LORA)
    assert recipe.model.name == "tiny"
    assert recipe.method.kind == "lora" and recipe.method.rank == 8
    assert parse_recipe(recipe.to_toml()) == recipe


@pytest.mark.parametrize("text, line", [
    ("", None),  # an empty file is not a training run
    ('name = "x"\n[train]\nmax_steps = 3\n', None),
    ('name = "x"\n[method]\nrank = 4\n', 2),
])
def test_method_kind_is_required(text, line):
    err = error_of(text)
    assert (err.file, err.key, err.line) == ("r.toml", "method.kind", line)
    assert "missing" in err.message
    for kind in METHOD_KINDS:
        assert kind in err.fix


def test_method_kind_is_required_with_overrides_too(tmp_path):
    path = tmp_path / "r.toml"
    path.write_text("")
    with pytest.raises(RecipeError) as info:
        load_recipe(path, ["train.max_steps=7"])
    assert info.value.key == "method.kind" and info.value.file == str(path)
    assert load_recipe(path, ["method.kind=sft", "model.name=tiny"]).method.kind == "sft"


def test_unknown_key_names_file_line_key_and_suggestion():
    err = error_of('name = "x"\n[method]\nkind = "lora"\nrnak = 4\n')
    assert (err.file, err.line, err.key) == ("r.toml", 4, "method.rnak")
    assert "did you mean 'rank'" in err.fix


def test_unknown_section_suggests_the_right_one():
    err = error_of('[modle]\nname = "x"\n' + LORA)
    assert err.key == "modle" and err.line == 1 and "'model'" in err.fix


def test_key_of_another_method_is_rejected_not_ignored():
    err = error_of('[method]\nkind = "prefix"\nrank = 3\n')
    assert err.key == "method.rank" and err.line == 3
    assert "virtual_tokens" in err.fix


def test_unknown_method_kind():
    err = error_of('[method]\nkind = "lorra"\n')
    assert err.key == "method.kind" and "'lora'" in err.fix


@pytest.mark.parametrize(
    "text, key",
    [
        ("[train]\nlearning_rate = nan\n", "train.learning_rate"),
        ("[train]\nmicro_batch = -1\n", "train.micro_batch"),
        ("[train]\nmax_steps = \"ten\"\n", "train.max_steps"),
        ("[launch]\nzero_stage = 5\n", "launch.zero_stage"),
        ("[launch]\ngpus = 0\n", "launch.gpus"),
        ("[dataset]\neval_split = 0.9\n", "dataset.eval_split"),
        ('name = "../../etc"\n', "name"),
    ],
)
def test_bad_values(text, key):
    err = error_of(LORA + text if text.startswith("[") else text + LORA)
    assert err.key == key
    assert err.line is not None


def test_bad_toml_syntax_names_the_line():
    err = error_of('name = "x"\n[train\n')
    assert err.line == 2 and "TOML" in err.message


def test_every_method_kind_parses():
    for kind in METHOD_KINDS:
        assert parse_recipe(f'[method]\nkind = "{kind}"\n').method.kind == kind


def test_overrides(tmp_path):
    path = tmp_path / "r.toml"
    path.write_text('[model]\nname = "tiny"\n[method]\nkind = "lora"\n')
    recipe = load_recipe(path, ["train.max_steps=7", "method.rank=4", "launch.gpus=[0,1]", "name=abc"])
    assert recipe.train.max_steps == 7 and recipe.method.rank == 4
    assert recipe.launch.gpus == [0, 1] and recipe.name == "abc"
    with pytest.raises(RecipeError) as info:
        load_recipe(path, ["train.max_stepz=7"])
    assert "max_steps" in info.value.fix


def test_a_bad_value_from_a_set_names_the_set_not_the_file_line(tmp_path):
    """The line of the value the --set replaced was named as the culprit."""
    path = tmp_path / "r.toml"
    path.write_text('[model]\nname = "tiny"\n[method]\nkind = "lora"\n[train]\nlearning_rate = 1e-3\nmax_steps = 5\n')
    with pytest.raises(RecipeErrors) as info:
        load_recipe(path, ["train.learning_rate=abc", "train.max_steps=4", "train.max_steps=-3", "train.lr=3"])
    errors = {e.key: e for e in info.value.errors}
    assert set(errors) == {"train.learning_rate", "train.max_steps", "train.lr"}
    assert errors["train.learning_rate"].line is None and errors["train.learning_rate"].file == str(path)
    assert errors["train.learning_rate"].message.endswith("(from --set train.learning_rate=abc)")
    assert errors["train.max_steps"].message.endswith("(from --set train.max_steps=-3)")  # the one that won
    assert errors["train.lr"].message == "unknown key 'lr' (from --set train.lr=3)"
    path.write_text('[method]\nkind = "lora"\n[train]\nlearning_rate = "x"\n[model]\nname = "tiny"\n')
    with pytest.raises(RecipeError) as info:  # the file's own error keeps its line
        load_recipe(path, ["train.max_steps=4"])
    assert (info.value.key, info.value.line) == ("train.learning_rate", 4) and "--set" not in info.value.message


def test_file_problems(tmp_path):
    with pytest.raises(RecipeError, match="not found"):
        load_recipe(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_bytes(b'name = "x"\n\xff\xfe = 1\n')
    with pytest.raises(RecipeError) as info:
        load_recipe(bad)
    assert info.value.line == 2 and "UTF-8" in info.value.message
    with pytest.raises(RecipeError, match="folder"):
        load_recipe(tmp_path)


def test_schema_has_descriptions_for_every_field():
    schema = json_schema()
    text = json.dumps(schema)
    assert "Peak learning rate" in text
    assert "discriminator" in text and "oneOf" in text  # method: one table per kind, chosen by kind
    assert schema["required"] == ["method"]  # every recipe names its method
    kinds = schema["properties"]["method"]["discriminator"]["mapping"]
    assert sorted(kinds) == sorted(METHOD_KINDS)
    for name in kinds.values():
        assert "kind" in schema["$defs"][name.split("/")[-1]]["required"]
    undescribed = [
        f"{model}.{field}"
        for model, definition in [("Recipe", schema), *schema["$defs"].items()]
        for field, info in definition.get("properties", {}).items()
        if not info.get("description")
    ]
    assert undescribed == []


def test_schema_cli_marks_method_required():
    out = subprocess.run([sys.executable, "-m", "tuiapp.cli", "schema"], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout)["required"] == ["method"]


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_fuzzed_text_never_raises_anything_but_recipe_error(text):
    try:
        parse_recipe(text, "fuzz.toml")
    except RecipeError as exc:
        assert str(exc)


toml_values = st.one_of(
    st.integers(-10**6, 10**6), st.floats(allow_nan=True), st.text(max_size=20), st.booleans(),
    st.lists(st.integers(-3, 3), max_size=3),
)


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(["model", "dataset", "method", "train", "launch", "bogus"]),
    st.sampled_from(["name", "kind", "max_steps", "gpus", "zero_stage", "rank", "learning_rate", "columns", "x"]),
    toml_values,
)
def test_fuzzed_structures_never_raise_anything_but_recipe_error(section, key, value):
    from tuiapp.core.config.recipe import recipe_from_dict

    try:
        recipe_from_dict({"method": {"kind": "lora"}, section: {key: value}})
    except RecipeError as exc:
        assert exc.key


def test_validate_cli_exit_codes(tmp_path):
    good = tmp_path / "good.toml"
    good.write_text('name = "g"\n[model]\nname = "tiny"\n[method]\nkind = "sft"\n')
    bad = tmp_path / "bad.toml"
    bad.write_text('[train]\nlr = 1\n[method]\nkind = "lora"\n')
    run = lambda p: subprocess.run([sys.executable, "-m", "tuiapp.cli", "validate", str(p)], capture_output=True, text=True)
    ok = run(good)
    assert ok.returncode == 0, ok.stderr + ok.stdout
    failed = run(bad)
    assert failed.returncode == 2
    assert "bad.toml:2: train.lr: unknown key 'lr'" in failed.stderr
    assert "Traceback" not in failed.stderr


def test_preference_kinds_apart_from_the_schema_match_it():
    """tuiapp.core.common.methods (the TUI's views read it without pydantic) names the schema's preference methods."""
    from tuiapp.core.common.methods import PREFERENCE_KINDS
    from tuiapp.core.config.recipe import PREFERENCE_MODELS

    assert PREFERENCE_KINDS == {model.model_fields["kind"].default for model in PREFERENCE_MODELS}


def test_an_adapter_setting_left_in_a_preference_method_says_where_it_belongs():
    # lora -> dpo keeps rank = 8 in [method]: "remove it" lost the adapter the user wanted
    text = 'name = "x"\n[method]\nkind = "dpo"\nrank = 8\n'
    with pytest.raises(RecipeError) as caught:
        parse_recipe(text, file="r.toml")
    error = caught.value
    assert error.key == "method.rank" and error.line == 4
    assert "move it under [method.adapter]" in error.fix and "remove it to train every weight" in error.fix
    with pytest.raises(RecipeError) as caught:  # a key that is no adapter setting keeps the plain fix
        parse_recipe('name = "x"\n[method]\nkind = "dpo"\nbogus = 1\n', file="r.toml")
    assert caught.value.fix.startswith("remove it; known keys: ")
