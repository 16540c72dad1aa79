"""Real architectures (the zoo: tiny random-weight models from transformers' configs) through the real
CLI, preflight and trainer: `llmtui model`, refusals before launch, every accepted pair training,
and a mixture of experts on two ZeRO-3 ranks."""

import json
import shutil
import subprocess
import sys

import pytest
from transformers import AutoModelForCausalLM

from tests.e2e.helpers import ROOT, llmtui, metrics, only_run, run_info
from tests.zoo_matrix import METHODS, STEPS, verdicts

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def zoo(tiny_model):
    from tuiapp.trainer.models.zoo import ensure_zoo_model

    return ensure_zoo_model


def test_llmtui_model_counts_what_the_model_holds_and_gives_verdicts(tmp_path, zoo):
    folder = zoo("qwen3_moe")
    done = subprocess.run([sys.executable, "-m", "tuiapp.cli", "model", str(folder), "--json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    model = AutoModelForCausalLM.from_pretrained(folder)
    total = sum(p.numel() for p in model.parameters())
    experts = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    params = report["profile"]["parameters"]
    assert params["total"] == total and params["experts"] == experts
    assert params["active"] == total - experts + experts * 2 // 4  # 2 of 4 experts per token
    assert report["methods"]["llama-adapter"]["verdict"] == "refused"
    assert report["methods"]["lora"]["verdict"] == "trains"
    text = subprocess.run([sys.executable, "-m", "tuiapp.cli", "model", str(folder)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300).stdout
    assert "active per token" in text and "router" in text and "no llama-adapter" in text
    # the estimate counts the same parameters, total and active
    recipe = _recipe(tmp_path, folder, "sft")
    estimate = subprocess.run([sys.executable, "-m", "tuiapp.cli", "estimate", str(recipe), "--json"], cwd=ROOT,
                              capture_output=True, text=True, timeout=300)
    assert estimate.returncode == 0, estimate.stderr
    counted = json.loads(estimate.stdout)
    assert counted["total_params"] == total and counted["active_params"] == params["active"], counted


def _recipe(tmp_path, model, method="lora", extra="", seq_len=64):
    path = tmp_path / ".recipes" / "r.toml"  # beside the runs folder, not in it
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'name = "zoo"\n[model]\nname = "{model}"\n[dataset]\nname = "demo:facts"\nmax_samples = 32\n'
                    f'[method]\nkind = "{method}"\n{extra}[train]\nmax_steps = 2\nmicro_batch = 2\n'
                    f'max_seq_len = {seq_len}\n')
    return path


def test_a_method_the_architecture_cannot_take_is_refused_before_launch(tmp_path, runs_dir, zoo):
    result = llmtui("run", str(_recipe(tmp_path, zoo("qwen3"), "llama-adapter")), runs_dir=runs_dir, timeout=300)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "llama-adapter" in result.stderr and "Qwen3ForCausalLM" in result.stderr
    assert "fix: use method.kind = 'lora'" in result.stderr
    assert not runs_dir.exists() or not [p for p in runs_dir.iterdir() if not p.name.startswith(".")]


def test_max_seq_len_beyond_a_learned_position_table_is_refused_before_launch(tmp_path, runs_dir, zoo):
    # gpt2 looks positions up in a table of n_positions rows: a longer sequence failed in the rank (IndexError)
    result = llmtui("run", str(_recipe(tmp_path, zoo("gpt2"), "lora", seq_len=1024)), runs_dir=runs_dir, timeout=300)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "train.max_seq_len = 1024 is longer than" in result.stderr and "512 learned positions" in result.stderr
    assert "set train.max_seq_len = 512 or less" in result.stderr and "Traceback" not in result.stderr
    assert not runs_dir.exists() or not [p for p in runs_dir.iterdir() if not p.name.startswith(".")]


@pytest.mark.parametrize("damage, needle", [
    (lambda c: c.write_text(c.read_text()[:40]), "is not valid JSON (line"),
    (lambda c: c.write_text(json.dumps({**json.loads(c.read_text()), "hidden_size": -5})),
     "hidden_size = -5 is not a positive whole number"),
])
def test_a_damaged_model_config_is_refused_naming_the_file(tmp_path, runs_dir, zoo, damage, needle):
    folder = tmp_path / ".models" / "model"
    shutil.copytree(zoo("qwen2"), folder)
    damage(folder / "config.json")
    result = llmtui("run", str(_recipe(tmp_path, folder)), runs_dir=runs_dir, timeout=300)
    assert result.returncode == 2, result.stdout + result.stderr
    assert needle in result.stderr and str(folder / "config.json") in result.stderr
    assert "Traceback" not in result.stderr


def test_a_base_model_without_a_chat_template_needs_dataset_template(tmp_path, runs_dir, zoo):
    folder = tmp_path / ".models" / "base"
    shutil.copytree(zoo("olmo2"), folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    refused = llmtui("run", str(_recipe(tmp_path, folder, "sft")), runs_dir=runs_dir, timeout=300)
    assert refused.returncode == 2 and "dataset.template" in refused.stderr and "chatml" in refused.stderr
    recipe = _recipe(tmp_path, folder, "sft", seq_len=256)  # llama3's headers are many tiny-tokenizer tokens
    recipe.write_text(recipe.read_text().replace("max_samples = 32\n", 'max_samples = 32\ntemplate = "llama3"\n'))
    trained = llmtui("run", str(recipe), runs_dir=runs_dir, timeout=600)
    assert trained.returncode == 0, trained.stdout + trained.stderr
    saved = json.loads((only_run(runs_dir) / "final" / "tokenizer_config.json").read_text())
    template = saved.get("chat_template") or (only_run(runs_dir) / "final" / "chat_template.jinja").read_text()
    assert "<|start_header_id|>" in template  # the template it trained with travels with the model


def test_every_accepted_zoo_pair_trains(tmp_path, tiny_model):
    """Each (architecture, method) preflight accepts trains 3 real steps, one process for all pairs (the
    families the dry step decides: tests/e2e/test_dry_step.py)."""
    from tuiapp.trainer.models.zoo import DRY_DECIDED

    accepted = [(r["arch"], r["method"]) for r in verdicts() if r["verdict"] == "trains" and r["arch"] not in DRY_DECIDED]
    assert len(accepted) >= 10 * len(METHODS) - 15
    done = subprocess.run([sys.executable, "-m", "tests.zoo_matrix", "train", str(tmp_path / "zoo")], cwd=ROOT,
                          capture_output=True, text=True, timeout=1800)
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith('{"arch"')]
    assert [(r["arch"], r["method"]) for r in rows] == accepted, done.stderr[-3000:]
    failed = [r for r in rows if r["code"] != 0 or r["steps"] != list(range(1, STEPS + 1))]
    assert not failed, failed
    attention = {r["arch"]: r["attention"] for r in rows if r["method"] == "sft"}
    assert attention["gemma2"] == "eager" and attention["qwen3"] == "sdpa"


def test_mixture_of_experts_on_two_zero3_ranks_adapts_experts_and_logs_their_load(tmp_path, runs_dir, zoo):
    extra = "rank = 4\ndropout = 0.0\n"
    recipe = _recipe(tmp_path, zoo("qwen3_moe"), "lora", extra).read_text()
    recipe = recipe.replace("[method]", "[launch]\ngpus = 2\nzero_stage = 3\n[method]")
    recipe = recipe.replace(f'name = "{zoo("qwen3_moe")}"\n',
                            f'name = "{zoo("qwen3_moe")}"\nrouter_aux_loss_coef = 0.01\nexperts_implementation = "eager"\n')
    recipe = recipe.replace("max_steps = 2", "max_steps = 3\nlogging_steps = 1")
    (tmp_path / ".recipes" / "r.toml").write_text(recipe)
    result = llmtui("run", str(tmp_path / ".recipes" / "r.toml"), runs_dir=runs_dir, timeout=900)
    run = only_run(runs_dir)
    assert result.returncode == 0, result.stdout + result.stderr + (run / "stdout.log").read_text()[-3000:]
    assert run_info(run)["status"] == "succeeded"
    rows = [r for r in metrics(run) if r.get("split", "train") == "train"]
    assert rows and all("moe/load_max" in r and "moe/aux_loss" in r for r in rows)
    assert all(len(r["moe/load"]) == 4 and r["moe/load_min"] <= 1.0 <= r["moe/load_max"] for r in rows)
    active = json.loads(subprocess.run([sys.executable, "-m", "tuiapp.cli", "model", str(zoo("qwen3_moe")), "--json"],
                                       cwd=ROOT, capture_output=True, text=True, timeout=300).stdout)
    active = active["profile"]["parameters"]["active"]
    timed = [r for r in rows if r.get("tokens_per_s")]
    assert timed and all(abs(r["model_tflops"] - 6 * active * r["tokens_per_s"] / 1e12) < 1e-12 for r in timed)
    plan = next(json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()
                if '"model_plan"' in line)
    assert plan["lora_targets"] == "all-linear" and plan["experts_implementation"] == "eager"
    adapter = json.loads((run / "final" / "adapter_config.json").read_text())
    assert adapter.get("target_parameters"), adapter  # the fused expert weights carry LoRA too
