"""method 'distill' end to end through `llmtui run` (the real launcher, CPU ranks):

- the distillation chain, in one runs folder: recipes/tiny-distill-teacher.toml (SFT of the tiny
  model: the teacher), then recipes/tiny-distill.toml (offline: that run's top-k logits, method.teacher
  = 'run:tiny-distill-teacher', cached before training) into the smaller bundled 'tiny-student' (half
  the layers and width, the same tokenizer), and the same recipe as plain SFT of tiny-student (same
  data, seed and steps). The distilled student's held-out KL to the teacher
  (trainer/methods/distill.py:heldout_kl, the trainer's own topk_kl on the cached teacher rows) falls by at
  least half from the student it starts from and ends below the SFT student's; the metric rows carry
  kl, ce, top1_agree and their eval_ forms.
- the estimate's disk row for the offline teacher cache, against that run's real cache file.
- a served teacher: the teacher run behind `llmtui serve`, method.teacher its /v1 URL: checked before
  launch, its top-k read through /v1/completions' prompt_logprobs equal to the local teacher's cache.
- mode 'online' with on-policy batches (lmbda > 0) and the SFT run's final model as the teacher
  (method.teacher = 'run:NAME'): it succeeds and its rows count the batches the student answered.
- a LoRA student ([method.adapter] kind 'lora' on the tiny model the teacher was trained from): only
  the adapter trains, and its held-out KL to the teacher falls.
- 2 CPU ranks at ZeRO-3 (the student sharded, the teacher's top-k computed under the ranks into its
  own cache entry): the run trains and its KL falls."""

import json
import shutil
from pathlib import Path

import pytest

from tests.e2e.helpers import ROOT, llmtui, metrics, run_info

pytestmark = pytest.mark.slow

PRESET = ROOT / "recipes" / "tiny-distill.toml"
TEACHER_PRESET = ROOT / "recipes" / "tiny-distill-teacher.toml"
SFT_NAME = "tiny-sft-student"


def _recipe_with_method(path: Path, name: str, method: str, train: dict | None = None) -> Path:
    """The preset with another name, [method] table and [train] keys."""
    lines, out, skipping, table = PRESET.read_text().splitlines(), [], False, ""
    for line in lines:
        if line.startswith("["):
            table = line.strip()
            skipping = table == "[method]"
            if skipping:
                out += ["[method]", *method.strip().splitlines()]
                continue
        if skipping:
            continue
        key = line.split("=")[0].strip()
        if line.startswith("name = ") and not table:
            line = f'name = "{name}"'
        elif train and table == "[train]" and key in train:
            line = f"{key} = {train.pop(key)}"
        out.append(line)
    if train:
        at = out.index("[train]") + 1
        out[at:at] = [f"{k} = {v}" for k, v in train.items()]
    path.write_text("\n".join(out) + "\n")
    return path


def _run(runs: Path, recipe: Path, name: str, *sets: str) -> Path:
    result = llmtui("run", str(recipe), *(f"--set={s}" for s in sets), runs_dir=runs, timeout=300)
    found = [p for p in runs.iterdir() if p.is_dir() and p.name.split("-", 2)[-1].rsplit("-", 1)[0] == name]
    assert len(found) == 1, result.stdout[-2000:] + result.stderr[-2000:]
    run_dir = found[0]
    log = (run_dir / "stdout.log").read_text(errors="replace")[-3000:] if (run_dir / "stdout.log").exists() else ""
    assert result.returncode == 0 and run_info(run_dir)["status"] == "succeeded", result.stdout[-2000:] + log
    return run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("distill")
    folder = root / "runs"
    teacher = _run(folder, TEACHER_PRESET, "tiny-distill-teacher")
    distill = _run(folder, PRESET, "tiny-distill")
    sft = _run(folder, _recipe_with_method(root / "sft.toml", SFT_NAME, 'kind = "sft"'), SFT_NAME)
    return {"root": root, "runs": folder, "teacher": teacher, "distill": distill, "sft": sft}


def _events(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines() if line.strip()]


def test_tiny_distill_run_learns_the_teacher(runs):
    run_dir = runs["distill"]
    train = [r for r in metrics(run_dir) if r.get("split", "train") == "train" and "loss" in r]
    kl = [r["kl"] for r in train]
    half = len(kl) // 2
    assert len(kl) >= 6 and sum(kl[half:]) / (len(kl) - half) < sum(kl[:half]) / half, kl
    assert all(0 <= r["top1_agree"] <= 1 and r["ce"] > 0 for r in train)
    # the loss is alpha (0.5) x KL + (1 - alpha) x CE, per micro batch: one batch a step here
    assert all(abs(r["loss"] - (0.5 * r["kl"] + 0.5 * r["ce"])) < 1e-3 * max(1, r["loss"]) for r in train), train[:2]
    evals = [r for r in metrics(run_dir) if r.get("split") == "eval"]  # held out, steps 6, 12, 18 and 24
    assert len(evals) == 4 and evals[-1]["eval_kl"] < evals[0]["eval_kl"], evals
    assert evals[-1]["eval_top1_agree"] > evals[0]["eval_top1_agree"] - 0.05 and "eval_ce" in evals[-1]
    distill = next(e for e in _events(run_dir) if e.get("event") == "distill")
    assert distill["mode"] == "offline" and distill["top_k"] == 32
    assert distill["teacher"] == str((runs["teacher"] / "final").resolve())  # run:tiny-distill-teacher, resolved
    info = json.loads((run_dir / "final" / "llmtui.json").read_text())
    assert info["method"] == "distill" and info["weights"] == "sft"
    show = llmtui("show", run_dir.name, runs_dir=runs["runs"], timeout=60)
    assert show.returncode == 0 and "  distill   kl " in show.stdout and "  held out  kl " in show.stdout, show.stdout


def test_the_distilled_student_beats_sft_on_held_out_kl(runs):
    from transformers import AutoConfig

    from tuiapp.core.config.recipe import load_recipe
    from tuiapp.trainer.methods.distill import heldout_kl
    from tuiapp.trainer.models.bundled import resolve_model_path

    recipe = load_recipe(PRESET)
    recipe.method.teacher = str(runs["teacher"] / "final")  # what run:tiny-distill-teacher resolves to
    student_start = resolve_model_path(recipe.model.name)  # the bundled tiny-student
    student, teacher = (AutoConfig.from_pretrained(p) for p in (student_start, recipe.method.teacher))
    assert student.num_hidden_layers < teacher.num_hidden_layers and student.hidden_size < teacher.hidden_size
    assert Path(student_start, "tokenizer.json").read_text() == Path(recipe.method.teacher, "tokenizer.json").read_text()
    start = heldout_kl(recipe, student_start)
    distilled = heldout_kl(recipe, runs["distill"] / "final")
    sft = heldout_kl(recipe, runs["sft"] / "final")
    figures = f"held-out KL: start {start['kl']:.3f}, distilled {distilled['kl']:.3f}, sft {sft['kl']:.3f}"
    print(figures)
    assert start["tokens"] == distilled["tokens"] == sft["tokens"] > 0
    assert distilled["kl"] <= start["kl"] / 2, figures
    assert distilled["kl"] < sft["kl"], figures
    assert distilled["top1_agree"] > sft["top1_agree"], (distilled, sft)
    steps = [max(r["step"] for r in metrics(runs[k])) for k in ("distill", "sft")]
    assert steps[0] == steps[1] == recipe.train.max_steps


def test_online_on_policy_distillation_from_an_earlier_run(runs):
    """mode 'online', lmbda 0.75, the SFT run's final model as the teacher ('run:NAME')."""
    method = f'kind = "distill"\nteacher = "run:{SFT_NAME}"\nmode = "online"\nlmbda = 0.75\nmax_new_tokens = 6'
    recipe = _recipe_with_method(runs["root"] / "online.toml", "tiny-distill-online", method,
                                 {"max_steps": 4, "micro_batch": 4, "eval_steps": 0})
    run_dir = _run(runs["runs"], recipe, "tiny-distill-online")
    train = [r for r in metrics(run_dir) if r.get("split", "train") == "train" and "loss" in r]
    assert len(train) == 4 and all("kl" in r and "top1_agree" in r for r in train), train
    assert sum(r["on_policy"] for r in train) >= 1, train  # batches whose answers the student sampled
    distill = next(e for e in _events(run_dir) if e.get("event") == "distill")
    assert distill["mode"] == "online" and distill["teacher"] == str((runs["sft"] / "final").resolve())


def test_the_estimate_counts_the_teacher_cache_on_disk(runs):
    """The estimate's disk row against the offline run's real cache file: the formula (top_k x (4-byte
    id + 4-byte logit) per token + an offset per example) is exact, but for the safetensors header
    (under 1 KB), given the real token count; the estimate guesses the tokens from the dataset's
    characters and must land within 15% of the real file."""
    from tuiapp.core.config.recipe import load_recipe
    from tuiapp.core.plan import distill as plan
    from tuiapp.core.plan.estimate import estimate_recipe, load_model_config

    recipe = load_recipe(PRESET)
    event = next(e for e in _events(runs["distill"]) if e.get("event") == "distill")
    real = Path(event["cache"]).stat().st_size
    assert real == event["cache_bytes"] and event["cache_tokens"] > 0
    examples = recipe.dataset.max_samples  # the train and held-out rows, both cached
    assert 0 <= real - plan.topk_cache_bytes(event["cache_tokens"], examples, recipe.method.top_k) < 1024
    est = estimate_recipe(recipe, load_model_config(recipe.model.name), 1, cuda=False)
    print(f"teacher cache: estimated {est.teacher_cache['bytes']:,} bytes ({est.teacher_cache['tokens']:,} tokens), "
          f"real {real:,} bytes ({event['cache_tokens']:,} tokens)")
    assert est.teacher_cache["examples"] == examples
    assert abs(est.teacher_cache["bytes"] - real) <= 0.15 * real, (est.teacher_cache, real)
    shown = llmtui("estimate", str(PRESET), runs_dir=runs["runs"], timeout=120)  # run:tiny-distill-teacher is there
    assert shown.returncode == 0, shown.stdout + shown.stderr
    row = next(line for line in shown.stdout.splitlines() if line.startswith("disk"))
    assert f"teacher cache {est.teacher_cache['bytes'] / 1e6:.1f} MB" in row and "96 examples" in row, row


def test_a_served_teacher_gives_the_local_teachers_top_k_and_distils(runs):
    """The teacher run served by `llmtui serve` and named by its URL: preflight compares the folder
    its /v1/models names with the student's tokenizer, the cache is read over HTTP (vLLM's
    prompt_logprobs) and equals the local teacher's cache of the offline run, position by position;
    the run trains on it. Stopped, the server makes the next launch a refusal naming the URL."""
    import socket

    import torch
    from safetensors.torch import load_file

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    teacher = runs["teacher"]
    started = llmtui("serve", teacher.name, "--port", str(port), runs_dir=runs["runs"], timeout=300)
    assert started.returncode == 0, started.stdout + started.stderr
    method = f'kind = "distill"\nteacher = "{url}"\nmode = "offline"\ntop_k = 32'
    recipe = _recipe_with_method(runs["root"] / "served.toml", "tiny-distill-served", method,
                                 {"max_steps": 3, "eval_steps": 0})
    try:
        checked = llmtui("validate", str(recipe), runs_dir=runs["runs"], timeout=120)
        assert checked.returncode == 0 and "method.teacher" not in checked.stdout, checked.stdout + checked.stderr
        run_dir = _run(runs["runs"], recipe, "tiny-distill-served")
    finally:
        stopped = llmtui("serve", teacher.name, "--stop", runs_dir=runs["runs"], timeout=120)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    event = next(e for e in _events(run_dir) if e.get("event") == "distill")
    assert event["teacher"] == url
    local_event = next(e for e in _events(runs["distill"]) if e.get("event") == "distill")
    served, local = load_file(event["cache"]), load_file(local_event["cache"])
    offsets = served["offsets"]  # the training split's (this run holds out none: eval_steps 0), then the local's eval
    assert torch.equal(offsets, local["offsets"][:len(offsets)]) and len(offsets) > 80
    ends = set((offsets[1:] - 1).tolist())  # each example's last position: never trained, not read
    keep = torch.tensor([i not in ends for i in range(int(offsets[-1]))])
    local = {key: local[key][:int(offsets[-1])] for key in ("ids", "logits")}
    same_ids = (served["ids"][keep] == local["ids"][keep]).all(-1)
    assert same_ids.float().mean() > 0.99, same_ids.float().mean()  # ties at the k-th place may swap
    p_served = torch.softmax(served["logits"][keep][same_ids], -1)
    p_local = torch.softmax(local["logits"][keep][same_ids], -1)
    assert torch.allclose(p_served, p_local, atol=1e-4), (p_served - p_local).abs().max()
    train = [r for r in metrics(run_dir) if r.get("split", "train") == "train" and "loss" in r]
    assert len(train) == 3 and all("kl" in r for r in train), train

    refused = llmtui("run", str(recipe), runs_dir=runs["runs"], timeout=120)  # the server is gone now
    assert refused.returncode != 0 and f"{url} did not answer" in refused.stdout + refused.stderr



def test_a_lora_student_trains_only_its_adapter(runs):
    """The tiny model (the teacher's own start) with a LoRA adapter learns from the teacher: the run's
    trained parameters are exactly the adapter's tensors, final/ holds the adapter alone, and the
    held-out KL to the teacher falls (measured on the base and on base + adapter)."""
    import math

    from safetensors import safe_open

    from tuiapp.core.config.recipe import load_recipe
    from tuiapp.trainer.methods.distill import heldout_kl
    from tuiapp.trainer.models.bundled import resolve_model_path

    method = 'kind = "distill"\nteacher = "run:tiny-distill-teacher"\nmode = "offline"\ntop_k = 32\n' \
             '[method.adapter]\nkind = "lora"\nrank = 8'
    recipe = _recipe_with_method(runs["root"] / "lora.toml", "tiny-distill-lora", method, {"max_steps": 12})
    recipe.write_text(recipe.read_text().replace('name = "tiny-student"', 'name = "tiny"'))
    run_dir = _run(runs["runs"], recipe, "tiny-distill-lora")
    started = next(e for e in _events(run_dir) if e.get("event") == "started")
    final = run_dir / "final"
    assert (final / "adapter_config.json").exists() and not (final / "model.safetensors").exists()
    with safe_open(final / "adapter_model.safetensors", "pt") as adapter:
        shapes = {name: adapter.get_slice(name).get_shape() for name in adapter.keys()}  # noqa: SIM118
    assert shapes and all("lora_A" in name or "lora_B" in name for name in shapes), shapes
    adapter_numel = sum(math.prod(shape) for shape in shapes.values())
    assert started["trainable_params"] == adapter_numel < started["params"] // 10, (started, adapter_numel)
    train = [r for r in metrics(run_dir) if r.get("split", "train") == "train" and "loss" in r]
    kl = [r["kl"] for r in train]
    assert len(kl) == 12 and sum(kl[6:]) < sum(kl[:6]), kl
    frozen = load_recipe(run_dir / "recipe.toml")  # method.teacher: the teacher run's final model
    base, tuned = heldout_kl(frozen, resolve_model_path("tiny")), heldout_kl(frozen, final)
    print(f"LoRA student's held-out KL to the teacher: base {base['kl']:.3f}, with the adapter {tuned['kl']:.3f}")
    assert base["tokens"] == tuned["tokens"] > 0
    assert tuned["kl"] < 0.9 * base["kl"] and tuned["top1_agree"] > base["top1_agree"], (base, tuned)


def test_two_ranks_zero3_distillation_trains(runs):
    """The preset on 2 CPU ranks at ZeRO-3 with top_k 16: a cache entry of its own, computed under the
    two ranks; the run trains and its KL to the teacher falls by more than half."""
    method = 'kind = "distill"\nteacher = "run:tiny-distill-teacher"\nmode = "offline"\ntop_k = 16'
    recipe = _recipe_with_method(runs["root"] / "zero3.toml", "tiny-distill-zero3", method,
                                 {"max_steps": 12, "eval_steps": 0})
    run_dir = _run(runs["runs"], recipe, "tiny-distill-zero3", "launch.gpus=2", "launch.zero_stage=3")
    assert run_info(run_dir)["ranks"] == 2
    events = _events(run_dir)
    started = next(e for e in events if e.get("event") == "started")
    first = next(e for e in events if e.get("event") == "first_step")
    assert started["world_size"] == 2 and first["optimizer_wrappers"][-1] == "DeepSpeedZeroOptimizer_Stage3", first
    distill = next(e for e in events if e.get("event") == "distill")
    single = next(e for e in _events(runs["distill"]) if e.get("event") == "distill")
    assert distill["top_k"] == 16 and distill["cache"] != single["cache"] and Path(distill["cache"]).exists()
    train = [r for r in metrics(run_dir) if r.get("split", "train") == "train" and "loss" in r]
    kl = [r["kl"] for r in train]
    assert len(kl) == 12 and sum(kl[-3:]) < 0.5 * sum(kl[:3]), kl


def test_a_teacher_with_another_tokenizer_is_refused_by_llmtui_run_before_anything_exists(tmp_path, tiny_model):
    """Through the CLI: the tiny model's own weights as the teacher, its tokenizer with two tokens'
    ids swapped, exits 2 naming method.teacher and the token; no run folder is made."""
    teacher = tmp_path / "other-teacher"
    shutil.copytree(tiny_model, teacher)
    tokenizer = json.loads((teacher / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    first, second = sorted(vocab, key=vocab.get)[100:102]
    vocab[first], vocab[second] = vocab[second], vocab[first]
    (teacher / "tokenizer.json").write_text(json.dumps(tokenizer))
    recipe = _recipe_with_method(tmp_path / "mismatch.toml", "mismatch",
                                 f'kind = "distill"\nteacher = "{teacher}"\nmode = "offline"')
    runs = tmp_path / "runs"
    result = llmtui("run", str(recipe), runs_dir=runs, timeout=300)
    out = result.stdout + result.stderr
    assert result.returncode == 2, out
    assert "method.teacher" in out and "lacks weights" not in out and repr(first) in out, out
    assert not (runs.exists() and [p for p in runs.iterdir() if not p.name.startswith(".")]), out
