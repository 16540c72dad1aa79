"""Real sample data (../shared/data) trains with the matching format, and runs chain:
pretrain on c4 → SFT from `run:NAME` on alpaca → LoRA on sharegpt tool calls."""

import pytest

from tests.conftest import SHARED_DATA
from tests.e2e.helpers import llmtui, only_run, run_info, train_steps

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="../shared/data is absent")]


def run_ok(runs, recipe, *sets):
    args = ["run", recipe]
    for item in ("train.max_steps=3", "train.eval_steps=0", "train.save_steps=0", "dataset.eval_split=0.0", *sets):
        args += ["--set", item]
    result = llmtui(*args, runs_dir=runs)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return result


def test_pretrain_c4_then_sft_alpaca_then_lora_toolcalls(tmp_path):
    runs = tmp_path / "runs"
    run_ok(runs, "recipes/tiny-pretrain.toml", f'dataset.name="{SHARED_DATA / "c4_demo.jsonl"}"', 'name="c4pre"')
    run_ok(runs, "recipes/tiny-sft.toml", f'dataset.name="{SHARED_DATA / "alpaca_en_demo.json"}"',
           'model.name="run:c4pre"', 'name="alpaca-sft"', 'dataset.format="alpaca"')
    run_ok(runs, "recipes/tiny-lora.toml", f'dataset.name="{SHARED_DATA / "glaive_toolcall_en_demo.json"}"',
           'model.name="run:alpaca-sft"', 'name="tools-lora"', 'dataset.format="sharegpt"')
    by_name = {run_info(p)["name"]: p for p in runs.iterdir() if not p.name.startswith(".")}
    assert set(by_name) == {"c4pre", "alpaca-sft", "tools-lora"}
    sft_info = run_info(by_name["alpaca-sft"])
    assert sft_info["model_ref"] == "run:c4pre"
    assert str(by_name["c4pre"] / "final") in (by_name["alpaca-sft"] / "recipe.toml").read_text()
    for path in by_name.values():
        assert train_steps(path) == [1, 2, 3]


@pytest.mark.parametrize("file, recipe", [("wiki_demo.txt", "tiny-pretrain"), ("alpaca_zh_demo.json", "tiny-sft")])
def test_other_samples_train(tmp_path, file, recipe):
    run_ok(tmp_path, f"recipes/{recipe}.toml", f'dataset.name="{SHARED_DATA / file}"')
    assert train_steps(only_run(tmp_path)) == [1, 2, 3]
