"""Benchmarks without a model: the demo task's data and YAML, task names and YAMLs resolved, the
checks before launch, the recipe's [[eval.benchmarks]] and the scores' readers."""

import json

import pytest

from tuiapp.core.common.errors import RecipeError, RecipeErrors, UserError
from tuiapp.core.config.recipe import parse_recipe
from tuiapp.core.data import bench_tasks
from tuiapp.core.prelaunch import benchmark_checks
from tuiapp.core.run_folder import benchmarks

RECIPE = """
name = "b"
[model]
name = "tiny"
[dataset]
name = "demo:facts"
[method]
kind = "{kind}"
[train]
max_steps = 4
eval_steps = {eval_steps}
[[eval.benchmarks]]
task = "{task}"
limit = 5
"""


def _recipe(kind="sft", eval_steps=2, task="demo:facts-mc"):
    return parse_recipe(RECIPE.format(kind=kind, eval_steps=eval_steps, task=task), "b.toml")


def test_demo_records_are_four_distinct_choices_with_the_answer():
    records = bench_tasks.demo_records()
    assert len(records) == 260
    for record in records:
        assert len(set(record["choices"])) == 4
        assert record["question"] and 0 <= record["answer"] < 4
    assert records == bench_tasks.demo_records()  # fixed seed


def test_demo_task_folder_holds_the_yaml_over_its_jsonl(tmp_path):
    folder = bench_tasks.demo_task_folder(tmp_path)
    text = (folder / "llmtui_facts_mc.yaml").read_text()
    assert "task: llmtui_facts_mc" in text and "output_type: multiple_choice" in text
    data = folder / "facts_mc.jsonl"
    assert json.dumps(str(data)) in text
    assert len(data.read_text().splitlines()) == 260


def test_resolve_names_yaml_and_refusals(tmp_path):
    assert bench_tasks.resolve("arc_easy") == bench_tasks.Task("arc_easy", "arc_easy", None)
    (tmp_path / "mine.yaml").write_text("task: my_task\ndataset_path: json\n")
    task = bench_tasks.resolve("mine.yaml", tmp_path)
    assert (task.name, task.include) == ("my_task", str(tmp_path.resolve()))
    (tmp_path / "none.yaml").write_text("dataset_path: json\n")
    with pytest.raises(UserError, match="names no task") as found:
        bench_tasks.resolve("none.yaml", tmp_path, key="--benchmark")
    assert found.value.key == "--benchmark"
    with pytest.raises(UserError, match="task YAML not found"):
        bench_tasks.resolve("gone.yml", tmp_path)
    with pytest.raises(UserError, match="unknown demo benchmark"):
        bench_tasks.resolve("demo:other")
    with pytest.raises(UserError, match="not an lm-eval task name"):
        bench_tasks.resolve("two words")


def test_checks_before_launch(tmp_path):
    assert benchmark_checks.findings(_recipe(), tmp_path) == []
    (dpo,) = benchmark_checks.findings(_recipe(kind="dpo"), tmp_path)
    assert dpo.level == "error" and "--benchmark" in dpo.fix
    (none,) = benchmark_checks.findings(_recipe(eval_steps=0), tmp_path)
    assert none.key == "train.eval_steps"
    (gone,) = benchmark_checks.findings(_recipe(task="gone.yaml"), tmp_path)
    assert gone.key == "eval.benchmarks.0.task" and "task YAML not found" in gone.message
    (registry,) = benchmark_checks.findings(_recipe(task="hellaswag"), tmp_path)
    assert registry.level == "info" and "local datasets cache" in registry.message


def test_recipe_table_and_unknown_keys():
    recipe = _recipe()
    assert recipe.eval.benchmarks[0].limit == 5 and recipe.eval.benchmark_at == "evals"
    assert parse_recipe(recipe.to_toml(), "frozen.toml").eval == recipe.eval  # the frozen recipe keeps it
    with pytest.raises((RecipeError, RecipeErrors)):
        parse_recipe(RECIPE.format(kind="sft", eval_steps=2, task="x") + "shots = 3\n", "b.toml")


def test_scores_in_rows_curves_headline_and_table():
    row = benchmarks.metric_row({"t": {"acc": 0.5, "acc_norm": 0.6}})
    assert row == {"bench/t/acc": 0.5, "bench/t/acc_norm": 0.6}
    rows = [{"split": "eval", "step": 2, **row}, {"split": "train", "step": 3, "loss": 1.0},
            {"split": "eval", "step": 4, "bench/t/acc": 0.75, "bench/t/acc_norm": "nan"}]
    assert benchmarks.curves(rows) == {"bench/t/acc": [(2.0, 0.5), (4.0, 0.75)], "bench/t/acc_norm": [(2.0, 0.6)]}
    assert benchmarks.latest_scores(rows) == {"t": {"acc": 0.75}}
    assert benchmarks.headline({"t": {"acc": 0.5, "acc_norm": 0.6}}) == {"t": 0.6}
    table = benchmarks.table({"models": [{"model": "final", "step": 4, "scores": {"t": {"acc": 0.5}}},
                                         {"model": "base", "step": 0, "scores": {}}]})
    assert table[1].split() == ["final", "4", "0.5000"] and table[2].split() == ["base", "0", "-"]
