"""Preference tuning end to end (issue 12): every preference preset through `llmtui run`, the real
deepspeed launcher and TRL's trainers on CPU ranks, on the generated demo data and on the shared
samples; DPO learns; SFT -> DPO chains; a sweep over beta; 2-rank ZeRO-2/ZeRO-3 with the frozen
reference sharded; stop/resume; `llmtui data`, the estimate and bad input; the TUI's panes,
history column and compare on the real runs."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from tests.e2e.helpers import (
    kill_group,
    llmtui,
    metrics,
    only_run,
    run_info,
    stop_after,
    train_steps,
    wait_for,
)

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SHARED_DATA = ROOT.parent / "shared" / "data"
PAIR_METHODS = ["dpo", "simpo", "cpo", "orpo", "reward"]
METHODS = [*PAIR_METHODS, "kto"]
SHORT = ["--set", "train.max_steps=3", "--set", "train.save_steps=3", "--set", "train.eval_steps=3",
         "--set", "train.logging_steps=1"]


def events(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines() if line.strip()]


def train(run_dir: Path) -> list[dict]:
    return [r for r in metrics(run_dir) if r.get("split", "train") == "train"]


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def ran(result, run_dir: Path) -> str:
    log = (run_dir / "stdout.log").read_text(errors="replace")[-4000:] if (run_dir / "stdout.log").exists() else ""
    return result.stdout[-3000:] + result.stderr[-3000:] + log


def load_final(final: Path):
    """The final model as its method saved it: a reward model's value head, an adapter, or weights."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    info = json.loads((final / "llmtui.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(final)
    if info["method"] == "reward" and info["weights"] == "sft":
        model = AutoModelForSequenceClassification.from_pretrained(final)
    elif info["method"] == "reward":
        from peft import AutoPeftModelForSequenceClassification

        model = AutoPeftModelForSequenceClassification.from_pretrained(final, num_labels=1)  # one score
    elif info["weights"] == "sft":
        model = AutoModelForCausalLM.from_pretrained(final)
    else:
        from peft import AutoPeftModelForCausalLM

        model = AutoPeftModelForCausalLM.from_pretrained(final)
    ids = tokenizer("What is the capital of France?", return_tensors="pt")
    with torch.no_grad():
        out = model(**ids).logits
    assert torch.isfinite(out).all()
    if info["method"] == "reward":
        assert out.shape[-1] == 1  # one score: the value head
    return info


@pytest.fixture(scope="module")
def dpo_runs(tmp_path_factory):
    """The tiny-dpo preset as it is (40 steps, LoRA, reference = the base with the adapter off)."""
    runs = tmp_path_factory.mktemp("dpo-runs")
    result = llmtui("run", "recipes/tiny-dpo.toml", runs_dir=runs)
    run_dir = only_run(runs)
    assert result.returncode == 0, ran(result, run_dir)
    return runs


# ---------------------------------------------------------------- learning


def test_dpo_preset_learns_the_preferences(dpo_runs):
    run_dir = only_run(dpo_runs)
    rows = train(run_dir)
    assert [r["step"] for r in rows] == list(range(1, 41))
    quarter = len(rows) // 4
    first, last = rows[:quarter], rows[-quarter:]
    acc_first = mean([r["rewards/accuracies"] for r in first])
    acc_last = mean([r["rewards/accuracies"] for r in last])
    margin_first = mean([r["rewards/margins"] for r in first])
    margin_last = mean([r["rewards/margins"] for r in last])
    evals = [r for r in metrics(run_dir) if r.get("split") == "eval"]
    print(f"\ntiny-dpo: reward accuracy on the training pairs {acc_first:.3f} -> {acc_last:.3f}, "
          f"margin {margin_first:.4f} -> {margin_last:.4f}; eval accuracy "
          f"{[round(r['eval_rewards/accuracies'], 3) for r in evals]}")
    assert rows[0]["rewards/margins"] == 0.0  # the policy starts as the reference
    assert acc_last > 0.5
    assert margin_last > margin_first and margin_last > 0
    assert [r["step"] for r in evals] == [20, 40]
    assert evals[-1]["eval_rewards/accuracies"] > 0.5 and "perplexity" not in evals[-1]
    for key in ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies"):
        assert all(isinstance(r[key], float) for r in rows)
    reference = [e for e in events(run_dir) if e["event"] == "reference"]
    assert reference == [{**reference[0], "model": "the base, adapter off"}]
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["checkpoint-20", "checkpoint-40"]
    info = load_final(run_dir / "final")
    assert (info["method"], info["weights"]) == ("dpo", "lora")
    shown = json.loads(llmtui("show", run_dir.name, "--json", runs_dir=dpo_runs, check=True).stdout)
    assert shown["run"]["status"] == "succeeded"


# ---------------------------------------------------------------- every preset, two data sources


def _source(method: str, source: str) -> list[str]:
    if source == "demo":
        return []
    name = "kto_en_demo.json" if method == "kto" else "dpo_en_demo.json"
    return ["--set", f'dataset.name="{SHARED_DATA / name}"', "--set", "dataset.max_samples=64"]


_preset_runs: dict[tuple[str, str], tuple] = {}


def preset_run(method: str, source: str, tmp_path_factory) -> tuple:
    """(the `llmtui run` result, the run folder) of a preset's short run, trained once per session: the
    TUI test below compares the ORPO one with the DPO preset's run."""
    if (method, source) not in _preset_runs:
        runs = tmp_path_factory.mktemp(f"preset-{method}-{source}")
        result = llmtui("run", f"recipes/tiny-{method}.toml", *SHORT, *_source(method, source), runs_dir=runs)
        _preset_runs[method, source] = result, only_run(runs)
    return _preset_runs[method, source]


@pytest.mark.parametrize("source", ["demo", "shared"])
@pytest.mark.parametrize("method", METHODS)
def test_preset_trains_through_deepspeed(method, source, tmp_path, tmp_path_factory):
    if source == "shared" and not SHARED_DATA.is_dir():
        pytest.skip("../shared/data is absent")
    result, run_dir = preset_run(method, source, tmp_path_factory)
    assert result.returncode == 0, ran(result, run_dir)
    assert run_info(run_dir)["status"] == "succeeded"
    assert train_steps(run_dir) == [1, 2, 3]
    rows = train(run_dir)
    wanted = ["kl"] if method == "kto" else ["rewards/chosen", "rewards/rejected", "rewards/margins",
                                             "rewards/accuracies"]
    assert all(isinstance(r.get(k), float) for r in rows for k in wanted), rows[-1]
    assert all(isinstance(r["loss"], float) and r["tokens"] > 0 for r in rows)
    evals = [r for r in metrics(run_dir) if r.get("split") == "eval"]
    assert evals and isinstance(evals[-1]["eval_loss"], float)
    assert (run_dir / "checkpoints" / "checkpoint-3" / "trainer_state.json").is_file()
    info = load_final(run_dir / "final")
    assert info["method"] == method
    if source == "demo" and info["weights"] in ("lora", "dora"):  # the adapter merges into its base
        merged = tmp_path / "merged"
        done = llmtui("export", run_dir.name, "--out", str(merged), "--merge", runs_dir=run_dir.parent)
        assert done.returncode == 0, done.stderr
        assert not (merged / "adapter_config.json").exists() and (merged / "config.json").exists()
        import torch
        from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

        auto = AutoModelForSequenceClassification if method == "reward" else AutoModelForCausalLM
        ids = AutoTokenizer.from_pretrained(merged)("What is the capital of France?", return_tensors="pt")
        with torch.no_grad():
            assert torch.isfinite(auto.from_pretrained(merged)(**ids).logits).all()


# ---------------------------------------------------------------- chaining and sweeps


def test_sft_then_full_weight_dpo_against_a_frozen_copy(tmp_path):
    sft = llmtui("run", "recipes/tiny-chain-sft.toml", "--set", "train.max_steps=8", "--set", "train.eval_steps=0",
                 "--set", "train.save_steps=0", "--set", "dataset.eval_split=0", runs_dir=tmp_path)
    assert sft.returncode == 0, sft.stdout[-3000:] + sft.stderr[-3000:]
    dpo = llmtui("run", "recipes/tiny-chain-dpo.toml", *SHORT, runs_dir=tmp_path)
    assert dpo.returncode == 0, dpo.stdout[-3000:] + dpo.stderr[-3000:]
    sft_dir, dpo_dir = sorted((p for p in tmp_path.iterdir() if p.is_dir() and not p.name.startswith(".")),
                              key=lambda p: run_info(p)["created"])
    info = run_info(dpo_dir)
    assert info["status"] == "succeeded"
    assert Path(info["model"]) == sft_dir / "final"  # run:tiny-chain-sft, resolved and frozen
    reference = [e for e in events(dpo_dir) if e["event"] == "reference"][0]
    started = [e for e in events(dpo_dir) if e["event"] == "started"][0]
    assert reference["model"] == "frozen copy" and reference["params"] == started["params"]
    assert started["trainable_params"] == started["params"]  # every weight trains
    assert train(dpo_dir)[0]["rewards/margins"] == 0.0  # the reference is the SFT model itself
    assert load_final(dpo_dir / "final")["weights"] == "sft"


def test_a_sweep_over_beta(tmp_path):
    out = llmtui("sweep", "recipes/tiny-dpo.toml", "--set", "train.max_steps=3", "--set", "train.eval_steps=0",
                 "--set", "train.save_steps=0", "--set", "dataset.eval_split=0", "--set", "train.sample_prompts=[]",
                 "--grid", "method.beta=0.1,0.5", "--slots", "1", runs_dir=tmp_path, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "queued 2 runs" in out.stdout
    runs = sorted((p for p in tmp_path.iterdir() if p.is_dir() and not p.name.startswith(".")),
                  key=lambda p: run_info(p)["created"])
    try:
        wait_for(lambda: all(run_info(p)["status"] in ("succeeded", "failed", "stopped") for p in runs),
                 timeout=900, interval=1, what="the sweep")
    finally:
        for run_dir in runs:
            kill_group(run_dir)
    assert [run_info(p)["status"] for p in runs] == ["succeeded", "succeeded"], [ran(out, p) for p in runs]
    import tomllib

    betas = [tomllib.loads((p / "recipe.toml").read_text())["method"]["beta"] for p in runs]
    assert sorted(betas) == [0.1, 0.5]
    assert all(train_steps(p) == [1, 2, 3] for p in runs)


# ---------------------------------------------------------------- ranks, ZeRO, stop/resume


@pytest.mark.parametrize("stage", [2, 3])
def test_two_ranks_full_weight_dpo(stage, tmp_path):
    result = llmtui("run", "recipes/tiny-chain-dpo.toml", "--set", 'model.name="tiny"', "--set", "launch.gpus=2",
                    "--set", f"launch.zero_stage={stage}", *SHORT, runs_dir=tmp_path)
    run_dir = only_run(tmp_path)
    assert result.returncode == 0, ran(result, run_dir)
    info = run_info(run_dir)
    assert info["ranks"] == 2 and info["status"] == "succeeded"
    assert train_steps(run_dir) == [1, 2, 3]
    assert set(train(run_dir)[-1]["mem"]) == {"rank0", "rank1"}
    reference = [e for e in events(run_dir) if e["event"] == "reference"][0]
    assert reference["model"] == "frozen copy"
    if stage == 3:  # ZeRO-3 shards the reference like the policy: each rank holds about half
        assert reference["params_on_rank"] < 0.6 * reference["params"]
    else:
        assert reference["params_on_rank"] == reference["params"]
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(run_dir / "final")
    assert sum(p.numel() for p in model.parameters()) == reference["params"]  # gathered, not shards


def test_stop_then_resume_a_kto_run(tmp_path):
    long = ["--set", "train.max_steps=12", "--set", "train.save_steps=0", "--set", "train.eval_steps=0",
            "--set", "dataset.eval_split=0", "--set", "train.sample_prompts=[]"]
    llmtui("run", "recipes/tiny-kto.toml", *long, "--detach", runs_dir=tmp_path, check=True)
    run_dir = only_run(tmp_path)
    try:
        code, output = stop_after(run_dir, 3, tmp_path)
        assert code == 0, output
        assert run_info(run_dir)["status"] == "stopped"
        [checkpoint] = (run_dir / "checkpoints").glob("checkpoint-*")
        step = int(checkpoint.name.split("-")[1])
        assert 3 <= step < 12
        resumed = llmtui("resume", run_dir.name, runs_dir=tmp_path, timeout=600)
        assert resumed.returncode == 0, ran(resumed, run_dir)
    finally:
        kill_group(run_dir)
    assert run_info(run_dir)["status"] == "succeeded"
    assert train_steps(run_dir) == list(range(1, 13))  # continued from the checkpoint, no step twice
    started = [e for e in events(run_dir) if e["event"] == "started"]
    assert [e["step"] for e in started] == [0, step]
    assert all(isinstance(r["kl"], float) for r in train(run_dir))
    assert load_final(run_dir / "final")["method"] == "kto"


# ---------------------------------------------------------------- data, estimate, bad input


def test_llmtui_data_shows_chosen_rejected_and_what_trains(tmp_path):
    out = llmtui("data", "recipes/tiny-dpo.toml", "--show", "2", runs_dir=tmp_path, check=True).stdout
    assert out.count("preference pair") == 2
    assert "chosen (" in out and "rejected (" in out
    assert "⟦<|im_start|>user" in out  # the prompt is masked
    document = json.loads(llmtui("data", "recipes/tiny-dpo.toml", "--show", "1", "--json",
                                 runs_dir=tmp_path, check=True).stdout)
    [pair] = document
    masked = pair["labels"].count(-100)
    assert 0 < masked < len(pair["labels"]) and pair["rejected"]["labels"].count(-100) == masked
    assert pair["input_ids"][:masked] == pair["rejected"]["input_ids"][:masked]  # one prompt, two answers
    assert pair["text"] != pair["rejected"]["text"]
    kto = llmtui("data", "recipes/tiny-kto.toml", "--show", "2", runs_dir=tmp_path, check=True).stdout
    assert "label true" in kto and "label false" in kto


def test_estimate_counts_the_reference_of_full_weight_dpo(tmp_path):
    full = json.loads(llmtui("estimate", "recipes/tiny-chain-dpo.toml", "--set", 'model.name="tiny"', "--json",
                             runs_dir=tmp_path, check=True).stdout)
    lora = json.loads(llmtui("estimate", "recipes/tiny-dpo.toml", "--json", runs_dir=tmp_path, check=True).stdout)
    assert full["memory"]["reference"] == full["total_params"] * 4  # fp32 weights on CPU, one whole copy
    assert lora["memory"]["reference"] == 0
    assert lora["trainable_params"] < full["trainable_params"]


@pytest.mark.parametrize(("recipe", "dataset", "said"), [
    ("tiny-dpo", "demo:facts", "dpo trains on preference pairs"),
    ("tiny-kto", "demo:prefs", "kto trains on answers labelled good or bad"),
    ("tiny-lora", "demo:prefs", "holds preference pairs"),
])
def test_wrong_data_is_refused_before_anything_launches(recipe, dataset, said, tmp_path):
    result = llmtui("run", f"recipes/{recipe}.toml", "--set", f'dataset.name="{dataset}"', runs_dir=tmp_path)
    assert result.returncode == 2
    text = result.stdout + result.stderr
    assert said in text and "dataset.name" in text and "fix:" in text
    assert not [p for p in tmp_path.iterdir() if p.is_dir()]  # nothing was created


def test_kto_on_the_shared_pairs_is_refused_naming_the_file(tmp_path):
    if not SHARED_DATA.is_dir():
        pytest.skip("../shared/data is absent")
    result = llmtui("validate", "recipes/tiny-kto.toml", "--set",
                    f'dataset.name="{SHARED_DATA / "dpo_en_demo.json"}"', runs_dir=tmp_path)
    assert result.returncode == 2
    text = result.stdout + result.stderr
    assert "dpo_en_demo.json holds chosen/rejected pairs" in text and "method.kind = 'dpo'" in text


# ---------------------------------------------------------------- the TUI on real preference runs


def test_tui_shows_rewards_history_column_and_compare(dpo_runs, tmp_path, tmp_path_factory):
    from tests.ui.ui_fixtures import screen_text, test_app
    from tests.ui.ui_fixtures import wait_for as ui_wait
    from tuiapp.ui.screens.compare import CompareScreen
    from tuiapp.ui.screens.home import HomeScreen
    from tuiapp.ui.screens.run_view import RunViewScreen
    from tuiapp.ui.widgets.charts import MetricChart
    from tuiapp.ui.widgets.runs_table import cells

    root = tmp_path / "runs"
    shutil.copytree(dpo_runs, root)
    dpo_id = only_run(dpo_runs).name
    other, orpo = preset_run("orpo", "demo", tmp_path_factory)  # tiny-orpo, SHORT
    assert other.returncode == 0, other.stdout[-2000:]
    shutil.copytree(orpo, root / orpo.name)
    orpo_id = orpo.name

    async def scenario():
        app = test_app(root, tmp_path, clock=__import__("time").time)
        async with app.run_test(size=(200, 50)) as pilot:
            await ui_wait(pilot, lambda: isinstance(app.screen, HomeScreen) and app.screen.summarized,
                          what="history")
            rows = {r.id: r for r in app.screen.model.rows.values()}
            dpo = rows[dpo_id]
            assert dpo.best_accuracy > 0.5 and dpo.best_margin > 0
            cell = cells(dpo, __import__("time").time())["preference"]
            assert cell == f"{dpo.best_accuracy:.2f}/{dpo.best_margin:.2f}"
            assert "acc/margin" in screen_text(app)

            app.push_screen(RunViewScreen(dpo_id))
            await ui_wait(pilot, lambda: isinstance(app.screen, RunViewScreen) and app.screen.loaded,
                          what="run view")
            view = app.screen
            rewards = view.query_one("#chart-rewards", MetricChart)
            assert [label for label, _ in rewards.series] == ["chosen", "rejected", "margin"]
            assert len(rewards.series[2][1]) == 40
            accuracy = view.query_one("#chart-accuracy", MetricChart)
            assert len(accuracy.series[0][1]) == 40
            view.action_next_pane()
            assert "Rewards" in [p.title for p in view.query_one("#rv-deck").panes]
            app.pop_screen()

            app.push_screen(CompareScreen([dpo_id, orpo_id]))
            await ui_wait(pilot, lambda: isinstance(app.screen, CompareScreen) and app.screen.loaded,
                          what="compare")
            compare = app.screen
            from tuiapp.ui.widgets.charts import CompareChart

            margin = compare.query_one("#cmp-chart-rewards-margins", CompareChart)
            assert [len(series) for _, series in margin.series] == [40, 3]
            from textual.widgets import DataTable

            summary = compare.query_one("#cmp-summary", DataTable)
            assert [str(c.label) for c in summary.columns.values()][-2:] == ["best acc", "best margin"]

    asyncio.run(scenario())


def test_the_form_writes_a_preference_recipe_with_an_adapter():
    from tuiapp.ui.formdata import check_values, default_values

    values = default_values("dpo")
    values["dataset.name"] = "demo:prefs"
    values["method.adapter"] = '{kind = "lora", rank = 4}'
    check = check_values(values, "dpo")
    assert not check.errors, check.errors
    assert check.recipe.method.adapter.rank == 4
    assert "[method.adapter]" in check.toml
    values["method.adapter"] = ""
    check = check_values(values, "dpo")
    assert check.recipe.method.adapter is None and "adapter" not in check.toml
    values["method.adapter"] = '{kind = "lora", rnak = 4}'
    [error] = check_values(values, "dpo").errors
    assert error.key == "method.adapter.rnak" and "rank" in error.fix


# ---------------------------------------------------------------- GPU-only paths (skip without CUDA)


def _cuda() -> bool:
    from tuiapp.core.plan.launcher import cuda_device_count

    return cuda_device_count() > 0


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("adapter", ["lora", "qlora", "full"])
def test_dpo_in_bf16_on_gpu(adapter, tmp_path):
    """What gpu-qwen-0.5b-dpo-lora.toml does (bf16, LoRA; also QLoRA and every weight against a bf16
    frozen copy), on the tiny model: that preset's hub model and data cannot be fetched offline."""
    import importlib.util

    if adapter == "qlora" and importlib.util.find_spec("bitsandbytes") is None:
        pytest.skip("needs bitsandbytes")
    recipe = tmp_path / "dpo.toml"
    text = (ROOT / "recipes" / "tiny-dpo.toml").read_text()
    if adapter == "full":
        text = text[: text.index("[method.adapter]")] + text[text.index("[train]"):]
    else:
        text = text.replace('kind = "lora"', f'kind = "{adapter}"')
    recipe.write_text(text)
    result = llmtui("run", str(recipe), *SHORT, "--set", "train.precision='bf16'", runs_dir=tmp_path / "runs")
    run_dir = only_run(tmp_path / "runs")
    assert result.returncode == 0, ran(result, run_dir)
    rows = train(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(isinstance(r["rewards/accuracies"], float) for r in rows)
    assert rows[-1]["mem"]["rank0"]["device"].startswith("cuda")
    reference = [e for e in events(run_dir) if e["event"] == "reference"][0]
    assert reference["model"] == ("frozen copy" if adapter == "full" else "the base, adapter off")
