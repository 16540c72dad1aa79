"""llmtui against LLaMA-Factory, the tool users would pick instead: one epoch of LoRA SFT each.

    .venv/bin/python bench/bench_peer.py [--reps 3] [--rows unpacked,budget,best] [--threads 2,1]
        [--models llmtui,peer] [--write]

Both tools get the same model folder (the bundled tiny Llama and its ChatML tokenizer, exported
once; with --models peer also one laid out like the peer's own test model, see MODELS), the same
data file (alpaca_en_demo.json), the same settings (LoRA r8 α16 dropout 0.05 on every linear
layer, micro batch 8, max length 512, lr 1e-3 cosine, 10% warmup, seed 42, no eval, no
checkpoints, a log line every 5 steps, one epoch) and one CPU process each, with the same number
of threads (each row at every count of --threads). Repetitions alternate which tool goes first. Rows compare like with like:
gradient checkpointing set the same in both, unpacked against unpacked, each tool's best
setting against the other's.

LLaMA-Factory runs in its own virtual environment, made on first use outside the checkout
(~/.cache/llmtui-bench/peer-venv, or $LLMTUI_BENCH_CACHE/peer-venv): `pip install
torch==<this torch> llamafactory`, torch coming from this machine's wheel. Its torchvision/torchaudio wheels are built for another torch and break
`import transformers`; it needs neither for text SFT, so they are removed (and an empty
`torchaudio` module stands in for the one import LLaMA-Factory makes at the top of a module). When the peer cannot
be installed the benchmark prints one line saying why and exits 0. It is run through its own
`run_exp` with a callback that stamps the first step and counts the non-padding tokens (the
same as `llamafactory-cli train`, which on a CPU machine calls run_exp in the same process).

With --write the markdown replaces the section "## Peer: LLaMA-Factory" of bench/RESULTS.md
(and only that section).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
from common import fmt, md_table  # noqa: E402
from tuiapp.core.plan.launcher import torch_extensions_dir  # noqa: E402

# DeepSpeed's CPU op: this environment's build in the llmtui cache (as a user's runs after the first),
# not a cold folder per benchmark that rebuilds it for minutes on a busy machine
os.environ["TORCH_EXTENSIONS_DIR"] = common.TORCH_EXTENSIONS = torch_extensions_dir({})

# outside the checkout (never in the working tree): LLMTUI_BENCH_CACHE, else ~/.cache/llmtui-bench
PEER_VENV = common.BENCH_CACHE / "peer-venv"
PEER_PYTHON = PEER_VENV / "bin" / "python"
SECTION = "## Peer: LLaMA-Factory"
SETTINGS = {"rank": 8, "alpha": 16, "dropout": 0.05, "micro_batch": 8, "max_len": 512, "lr": 1e-3,
            "warmup": 0.1, "seed": 42, "logging_steps": 5}
# name: (what it compares, llmtui train keys, LLaMA-Factory keys)
ROWS = {
    "unpacked": ("both unpacked, no gradient checkpointing",
                 {"packing": False, "gradient_checkpointing": False},
                 {"disable_gradient_checkpointing": True}),
    "checkpointed": ("both unpacked, both with gradient checkpointing (the peer's default)",
                     {"packing": False, "gradient_checkpointing": True},
                     {}),
    "best": ("each at its best: llmtui packing auto vs LF neat_packing, no checkpointing in either",
             {"packing": "auto", "gradient_checkpointing": False},
             {"neat_packing": True, "packing": True, "disable_gradient_checkpointing": True}),
    "budget": ("llmtui token-budget batches vs LF neat_packing, no checkpointing in either",
               {"packing": "auto", "gradient_checkpointing": False, "batching": "tokens"},
               {"neat_packing": True, "packing": True, "disable_gradient_checkpointing": True}),
}

# The model folders both tools train: llmtui's bundled tiny Llama (hidden 128, 4 layers, a 2,048-token
# vocabulary, tied embeddings), and one laid out like the peer's own test model,
# llamafactory/tiny-random-Llama-3 (4.1M parameters: hidden 16, 2 layers, 4 heads, intermediate 64,
# Llama 3's 128,256-token vocabulary, untied): its step is mostly the embedding and output head.
# That one is built here with random weights and the bundled ChatML tokenizer (the hub is not
# reachable); its ids use the first 2,048 rows, the output head computes all 128,256 logits.
MODELS = {"llmtui": "llmtui's tiny Llama", "peer": "the peer's test-model layout"}
PEER_LAYOUT = {"hidden_size": 16, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
               "num_key_value_heads": 4, "vocab_size": 128256, "tie_word_embeddings": False, "rope_theta": 500000.0,
               "max_position_embeddings": 1024}
BUILD_PEER_LAYOUT = r'''
import json, shutil, sys
from pathlib import Path
import torch
from transformers import LlamaConfig, LlamaForCausalLM
source, target, layout = Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3])
torch.manual_seed(0)
base = json.loads((source / "config.json").read_text())
config = LlamaConfig(**layout, bos_token_id=base.get("bos_token_id"), eos_token_id=base.get("eos_token_id"),
                     pad_token_id=base.get("pad_token_id"))
LlamaForCausalLM(config).save_pretrained(target)
for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"):
    if (source / name).exists():
        shutil.copy(source / name, target / name)
'''


def peer_layout_model(bundled: Path, cache: Path) -> Path:
    """A tiny random Llama laid out like the peer's test model (see MODELS), built once in the cache."""
    target = cache / "models" / "peer-layout-llama"
    if not (target / "config.json").exists():
        subprocess.run([common.PYTHON, "-c", BUILD_PEER_LAYOUT, str(bundled), str(target), json.dumps(PEER_LAYOUT)],
                       cwd=common.ROOT, check=True, capture_output=True)
    return target


# Runs inside the peer's venv: run_exp with a callback; writes stamps.json next to the outputs.
PEER_RUNNER = r'''
import importlib.machinery, json, sys, time, types
# llamafactory.data.mm_plugin imports torchaudio at the top; PyPI's torchaudio is built for another
# torch and fails to load, and text SFT never calls it: an empty module stands in
stub = types.ModuleType("torchaudio")
stub.__spec__ = importlib.machinery.ModuleSpec("torchaudio", None)
sys.modules["torchaudio"] = stub
from transformers import TrainerCallback
from llamafactory.train.tuner import run_exp

out = sys.argv[2]
stamps = {"t0": float(sys.argv[3])}

class Stamps(TrainerCallback):
    def on_train_begin(self, args, state, control, train_dataloader=None, **kw):
        stamps["train_begin"] = time.time()
        self.loader = train_dataloader
    def on_step_end(self, args, state, control, **kw):
        stamps.setdefault("first_step", time.time())
        stamps["steps"] = state.global_step
    def on_log(self, args, state, control, logs=None, **kw):
        if logs and "loss" in logs:
            stamps.setdefault("losses", []).append([state.global_step, logs["loss"]])
    def on_train_end(self, args, state, control, **kw):
        stamps["train_end"] = time.time()
        data = self.loader.dataset
        mask = data["attention_mask"]
        stamps["tokens"] = int(sum(sum(1 for v in m if v) for m in mask))
        stamps["rows"] = len(mask)

run_exp(json.load(open(sys.argv[1])), callbacks=[Stamps()])
stamps["exit"] = time.time()
json.dump(stamps, open(out + "/stamps.json", "w"))
'''


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ------------------------------------------------------------------ the peer's environment


def ensure_peer() -> str | None:
    """Make the peer's venv when missing; None when it imports, else why it cannot run."""
    check = [str(PEER_PYTHON), "-c", "import llamafactory, transformers.modeling_utils; print(llamafactory.__version__)"]
    if PEER_PYTHON.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return None
    import torch  # this venv's torch: the peer gets the same release

    pin = torch.__version__.split("+")[0]
    log(f"making LLaMA-Factory's venv in {PEER_VENV} (torch=={pin}; a few minutes, once)")
    steps = [
        [sys.executable, "-m", "venv", str(PEER_VENV)] if not PEER_PYTHON.exists() else None,
        [str(PEER_PYTHON), "-m", "pip", "install", "-q", f"torch=={pin}", "llamafactory"],
        [str(PEER_PYTHON), "-m", "pip", "uninstall", "-q", "-y", "torchvision", "torchaudio"],
    ]
    for step in filter(None, steps):
        done = subprocess.run(step, capture_output=True, text=True)
        if done.returncode != 0 and "uninstall" not in step:
            return f"pip failed: {' '.join(step[2:])}: {(done.stderr or done.stdout).strip().splitlines()[-1:]}"
    done = subprocess.run(check, capture_output=True, text=True)
    if done.returncode != 0:
        return f"llamafactory does not import: {(done.stderr or '').strip().splitlines()[-1:]}"
    return None


def peer_version() -> str:
    code = "import llamafactory, transformers, peft, torch; print(llamafactory.__version__, transformers.__version__, " \
           "peft.__version__, torch.__version__)"
    out = subprocess.run([str(PEER_PYTHON), "-c", code], capture_output=True, text=True)
    parts = (out.stdout.split() + ["?"] * 4)[:4]
    return f"LLaMA-Factory {parts[0]} (transformers {parts[1]}, peft {parts[2]}, torch {parts[3]})"


# ------------------------------------------------------------------ one run of each tool


def llmtui_recipe(model_dir: Path, data: Path, train: dict) -> str:
    s = SETTINGS
    lines = ['name = "peer-bench"', "", "[model]", f'name = "{model_dir}"', "", "[dataset]", f'name = "{data}"',
             'format = "alpaca"', "", "[method]", 'kind = "lora"', f"rank = {s['rank']}", f"alpha = {s['alpha']}",
             f"dropout = {s['dropout']}", 'target_modules = "all-linear"', "", "[train]", "epochs = 1",
             f"micro_batch = {s['micro_batch']}", f"max_seq_len = {s['max_len']}", f"learning_rate = {s['lr']}",
             'scheduler = "cosine"', f"warmup_ratio = {s['warmup']}", f"seed = {s['seed']}",
             f"logging_steps = {s['logging_steps']}", "save_steps = 0", "eval_steps = 0"]
    for key, value in train.items():
        lines.append(f"{key} = {json.dumps(value) if isinstance(value, str) else str(value).lower()}")
    return "\n".join(lines + ["", "[launch]", "gpus = 1", ""])


def run_llmtui(model_dir: Path, data: Path, train: dict, workdir: Path, env: dict) -> dict:
    workdir.mkdir(parents=True, exist_ok=True)
    recipe = workdir / "recipe.toml"
    recipe.write_text(llmtui_recipe(model_dir, data, train))
    runs = workdir / "runs"
    t0 = time.time()

    def run_dir_of() -> Path | None:
        return next((p for p in runs.iterdir() if p.is_dir() and not p.name.startswith(".")), None) if runs.is_dir() else None

    code = None
    try:
        with open(workdir / "cli.log", "wb") as out:
            code = subprocess.run([*common.llmtui_command(), "run", str(recipe), "--runs-dir", str(runs)], cwd=common.ROOT,
                                  env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  timeout=3600).returncode
    finally:
        if code is None:  # interrupted or timed out: the run lives in its own session; end it too
            common.kill_run(run_dir_of())
    wall = time.time() - t0
    run_dir = run_dir_of()
    events = {e.get("event"): e for e in common.read_jsonl(run_dir / "events.jsonl")} if run_dir else {}
    rows = [r for r in common.read_jsonl(run_dir / "metrics.jsonl") if r.get("split", "train") == "train"
            and r.get("loss") is not None] if run_dir else []
    last = rows[-1] if rows else {}
    begin, end = events.get("started", {}).get("time"), events.get("finished", {}).get("time")
    tokens_time = (last.get("time") - begin) if last and begin else None
    return {"tool": "llmtui", "ok": code == 0 and "finished" in events, "wall": wall,
            "ttfs": events["first_step"]["time"] - t0 if "first_step" in events else None,
            "train_s": (end - begin) if begin and end else None,
            "tokens": last.get("tokens"), "tokens_per_s": last.get("tokens") / tokens_time if tokens_time else None,
            "steps": last.get("step"), "loss": last.get("loss"), "log": str(workdir / "cli.log")}


def peer_args(model_dir: Path, data: Path, extra: dict, out: Path) -> dict:
    s = SETTINGS
    dataset_dir = out / "data"
    dataset_dir.mkdir(parents=True, exist_ok=True)
    (dataset_dir / "dataset_info.json").write_text(json.dumps({"bench_alpaca": {"file_name": str(data)}}))
    return {
        "model_name_or_path": str(model_dir), "stage": "sft", "do_train": True, "finetuning_type": "lora",
        "lora_rank": s["rank"], "lora_alpha": s["alpha"], "lora_dropout": s["dropout"], "lora_target": "all",
        "dataset": "bench_alpaca", "dataset_dir": str(dataset_dir), "template": "chatml", "cutoff_len": s["max_len"],
        "output_dir": str(out / "out"), "overwrite_output_dir": True, "logging_steps": s["logging_steps"],
        "save_strategy": "no", "plot_loss": False, "report_to": "none", "per_device_train_batch_size": s["micro_batch"],
        "gradient_accumulation_steps": 1, "learning_rate": s["lr"], "num_train_epochs": 1.0,
        "lr_scheduler_type": "cosine", "warmup_ratio": s["warmup"], "seed": s["seed"], "bf16": False, "fp16": False,
        "dataloader_num_workers": 0, "do_eval": False, **extra,
    }


def run_peer(model_dir: Path, data: Path, extra: dict, workdir: Path, env: dict) -> dict:
    workdir.mkdir(parents=True, exist_ok=True)
    args = workdir / "args.json"
    args.write_text(json.dumps(peer_args(model_dir, data, extra, workdir)))
    runner = workdir / "runner.py"
    runner.write_text(PEER_RUNNER)
    peer_env = {**env, "CUDA_VISIBLE_DEVICES": "", "DISABLE_VERSION_CHECK": "1", "WANDB_DISABLED": "true"}
    t0 = time.time()
    with open(workdir / "peer.log", "wb") as out:
        code = subprocess.run([str(PEER_PYTHON), str(runner), str(args), str(workdir), str(t0)], cwd=workdir,
                              env=peer_env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                              timeout=3600).returncode
    wall = time.time() - t0
    try:
        stamps = json.loads((workdir / "stamps.json").read_text())
    except (OSError, ValueError):
        stamps = {}
    losses = stamps.get("losses") or []
    begin, end = stamps.get("train_begin"), stamps.get("train_end")
    train_s = (end - begin) if begin and end else None
    return {"tool": "LLaMA-Factory", "ok": code == 0 and bool(stamps), "wall": wall,
            "ttfs": stamps["first_step"] - t0 if "first_step" in stamps else None, "train_s": train_s,
            "tokens": stamps.get("tokens"), "tokens_per_s": stamps["tokens"] / train_s if train_s and stamps.get("tokens") else None,
            "steps": stamps.get("steps"), "loss": losses[-1][1] if losses else None, "log": str(workdir / "peer.log")}


# ------------------------------------------------------------------ the table


def spread(values: list) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "—"
    mid = statistics.median(values)
    return f"{mid:.1f} s ({min(values):.0f}-{max(values):.0f})" if len(values) > 1 else f"{mid:.1f} s"


def ratio(a, b) -> str:
    return f"{a / b:.2f}×" if a and b else "—"


def _median(runs: list[dict], key: str):
    return common.median([r[key] for r in runs])


def _paired(runs: list[dict], key: str) -> list[str]:
    """peer / llmtui of each repetition's two runs, which ran one right after the other (the
    load of a shared machine drifts less within a pair than across repetitions)."""
    out = []
    for first, second in zip(runs[::2], runs[1::2], strict=False):
        pair = {first["tool"]: first, second["tool"]: second}
        ours, peer = pair.get("llmtui"), pair.get("LLaMA-Factory")
        if ours and peer and ours["ok"] and peer["ok"]:
            out.append(ratio(peer[key], ours[key]))
    return out or ["—"]


def markdown(results: dict, reps: int, info: dict) -> str:
    header = ["row", "tool", f"whole command, median of {reps} (min-max)", "training alone", "launch → first step",
              "non-padding tokens/s", "tokens / steps", "last logged loss", "load average before (1 min)"]
    table, ratios = [], []
    for key, runs in results.items():
        name, threads, model = (key.split("@") + ["", ""])[:3]
        label = ", ".join([name] + ([f"{threads} thread{'s' if threads != '1' else ''}"] if threads else [])
                          + ([MODELS[model]] if model else []))
        for tool in ("llmtui", "LLaMA-Factory"):
            mine = [r for r in runs if r["tool"] == tool and r["ok"]]
            losses = sorted({f"{r['loss']:.3f}" for r in mine if r["loss"] is not None})
            loads = [r["load"] for r in mine if r.get("load") is not None]
            table.append([label if tool == "llmtui" else "", tool, spread([r["wall"] for r in mine]),
                          fmt(_median(mine, "train_s"), ".1f") + " s", fmt(_median(mine, "ttfs"), ".1f") + " s",
                          fmt(_median(mine, "tokens_per_s"), ".0f"),
                          f"{fmt(_median(mine, 'tokens'), '.0f')} / {fmt(_median(mine, 'steps'), '.0f')}", ", ".join(losses) or "—",
                          f"{min(loads):.2f}-{max(loads):.2f}" if loads else "—"])
        ours = [r for r in runs if r["tool"] == "llmtui" and r["ok"]]
        peer = [r for r in runs if r["tool"] == "LLaMA-Factory" and r["ok"]]
        m = _median
        ratios.append([label, ROWS[name][0], ratio(m(peer, "wall"), m(ours, "wall")), ratio(m(peer, "train_s"), m(ours, "train_s")),
                       ", ".join(_paired(runs, "train_s")), ratio(m(ours, "tokens_per_s"), m(peer, "tokens_per_s")),
                       ratio(m(peer, "ttfs"), m(ours, "ttfs"))])
    lines = [SECTION, "",
             f"Made by `{info['command']}` ({info['minutes']:.0f} minutes; "
             f"{info['peer']}; llmtui at {info['commit']}). One epoch of alpaca_en_demo.json "
             f"({'the first ' + format(info['records'], ',') if info.get('records') else '1,000'} records), the "
             "same model folder and ChatML tokenizer for both tools (llmtui's tiny Llama unless the row names the "
             "peer's test-model layout: hidden 16, 2 layers, a 128,256-token vocabulary), LoRA r8 α16 dropout 0.05 on every linear layer, micro batch 8, "
             "max length 512, lr 1e-3 cosine with 10% warmup, seed 42, no eval, no checkpoints, a log line every 5 "
             f"steps, one CPU process each with OMP_NUM_THREADS={info['threads']}; repetitions alternate which tool "
             f"goes first. Load average at the start / end: {info['load_start']} / {info['load_end']}.", "",
             "Whole command = invocation to exit. Training alone = the trainer's train begin to end. Tokens/s = "
             "non-padding tokens of the epoch over the training time (llmtui: its metrics; LLaMA-Factory: the "
             "attention mask of its training set). The losses are each tool's last logged training loss.", "",
             md_table(header, table), "",
             md_table(["row", "compares", "whole command: llmtui faster by", "training alone: faster by",
                       "training alone, each repetition's back-to-back pair", "tokens/s: llmtui / LF",
                       "first step: faster by"], ratios), ""]
    failed = [r for runs in results.values() for r in runs if not r["ok"]]
    if failed:
        lines += [f"{len(failed)} run(s) failed and are left out: " + ", ".join(f"{r['tool']} ({r['log']})" for r in failed), ""]
    return "\n".join(lines)


def write_section(text: str) -> None:
    """Replace (or append) this section of RESULTS.md; the other sections stay as they are."""
    path = common.BENCH / "RESULTS.md"
    doc = path.read_text(encoding="utf-8") if path.exists() else ""
    if SECTION in doc:
        before, _, rest = doc.partition(SECTION)
        following = rest.find("\n## ")
        after = rest[following + 1:] if following >= 0 else ""
        keep = ""
        notes = rest.find("\n### Where llmtui's step time goes")  # written by hand from the profile; kept
        if notes >= 0 and (following < 0 or notes < following):
            keep = rest[notes + 1:following + 1 if following >= 0 else None]
        doc = before + text + ("\n" + keep if keep else "") + ("\n" + after if after else "")
    else:
        doc = doc.rstrip("\n") + "\n\n" + text
    path.write_text(doc, encoding="utf-8")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--rows", default="unpacked,best,budget", help=f"comma-separated, of {', '.join(ROWS)}")
    parser.add_argument("--write", action="store_true", help="write the section into bench/RESULTS.md")
    parser.add_argument("--json", default=None, help="also write every run's numbers here (after each run)")
    parser.add_argument("--from-json", default=None, help="only print (and --write) the tables of an earlier --json")
    parser.add_argument("--threads", default=f"{os.cpu_count() or 1},1",
                        help="comma-separated OMP_NUM_THREADS values, each row run at each (default: every core, then 1)")
    parser.add_argument("--models", default="llmtui",
                        help=f"comma-separated model folders both tools train, of {', '.join(MODELS)} (see MODELS; "
                        "'peer' takes ~6 minutes per run at 2 threads)")
    parser.add_argument("--records", type=int, default=0,
                        help="train on the first N records of alpaca_en_demo.json only (0 = all 1,000)")
    parser.add_argument("--profile", default=None, metavar="ROWS",
                        help="instead: one llmtui run per row (comma-separated) and one LLaMA-Factory run (the first "
                        "row's) under py-spy; print where a step's time goes")
    parser.add_argument("--profile-records", type=int, default=0, help="--profile on the first N records only")
    args = parser.parse_args(argv)
    common.exit_on_sigterm()
    if args.from_json:
        saved = json.loads(Path(args.from_json).read_text())
        text = markdown(saved["results"], args.reps, saved["info"])
        print(text)
        if args.write:
            write_section(text)
        return 0
    missing = common.missing_data_message(common.ALPACA)
    if missing:
        print(f"peer benchmark {missing}")
        return 0
    why = ensure_peer()
    if why:
        print(f"peer benchmark skipped: LLaMA-Factory cannot be installed here ({why})")
        return 0
    rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    try:
        threads = [int(t) for t in str(args.threads).split(",") if t.strip()]
    except ValueError:
        parser.error(f"--threads takes counts separated by commas, e.g. 2,1 (got '{args.threads}')")
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    for model in models:
        if model not in MODELS:
            parser.error(f"unknown model '{model}'; use {', '.join(MODELS)}")
    for name in rows:
        if name not in ROWS:
            parser.error(f"unknown row '{name}'; use {', '.join(ROWS)}")
    if "budget" in rows and not _has_token_batches():
        log("row 'budget' left out: this llmtui has no train.batching = 'tokens'")
        rows.remove("budget")
    started, load_start = time.time(), " ".join(f"{x:.2f}" for x in os.getloadavg())
    command = (f".venv/bin/python bench/bench_peer.py --reps {args.reps} --rows {','.join(rows)} "
               f"--threads {','.join(map(str, threads))} --models {','.join(models)}"
               + (f" --records {args.records}" if args.records else "") + " --write")
    work = common.temp_dir("llmtui-peer-")
    cache = work / "cache"
    env = common.bench_env(cache, cache / "hf-datasets")
    env["OMP_NUM_THREADS"] = str(threads[0])
    try:
        model_dir = common.ensure_model(cache)  # the bundled tiny Llama + ChatML tokenizer, a plain HF folder
        model_dirs = {"llmtui": model_dir}
        if "peer" in models:
            model_dirs["peer"] = peer_layout_model(model_dir, cache)
        data = common.data_file(common.ALPACA)
        first = args.profile_records if args.profile else args.records
        if first:  # the step is the same on fewer records; the run is shorter
            records = json.loads(data.read_text(encoding="utf-8"))[:first]
            data = work / "first-records.json"
            data.write_text(json.dumps(records), encoding="utf-8")
        if args.profile:
            wanted = [r for r in args.profile.split(",") if r in ROWS and (r != "budget" or _has_token_batches())]
            print(profile(wanted, model_dir, data, work, env))
            return 0
        # a row at each thread count on each model is its own table row: "unpacked@2@llmtui"
        results: dict[str, list[dict]] = {f"{name}@{t}@{m}": [] for m in models for t in threads for name in rows}
        for rep in range(args.reps):
            for key in results:
                name, t, model = key.split("@")
                env_t = {**env, "OMP_NUM_THREADS": t}
                _, ours, theirs = ROWS[name]
                order = ["llmtui", "peer"] if rep % 2 == 0 else ["peer", "llmtui"]
                for tool in order:
                    folder = work / f"{name}-{t}t-{model}-{rep}-{tool}"
                    load = os.getloadavg()[0]
                    if tool == "llmtui":
                        result = run_llmtui(model_dirs[model], data, ours, folder, env_t)
                    else:
                        result = run_peer(model_dirs[model], data, theirs, folder, env_t)
                    result["load"] = load
                    log(f"rep {rep + 1}/{args.reps} {name} {t} thread(s) {model} {result['tool']}: "
                        f"{'ok' if result['ok'] else 'FAILED'} {fmt(result['wall'])} s, first step "
                        f"{fmt(result['ttfs'])} s, train {fmt(result['train_s'])} s, "
                        f"{fmt(result['tokens_per_s'], '.0f')} tok/s, loss {fmt(result['loss'], '.3f')}, "
                        f"load before {load:.2f}")
                    results[key].append(result)
                    if args.json:  # after each run: an interrupted benchmark keeps what it measured
                        info = _info(started, env, load_start, command, threads, args.records)
                        Path(args.json).write_text(json.dumps({"info": info, "results": results}, indent=1))
        info = _info(started, env, load_start, command, threads, args.records)
        text = markdown(results, args.reps, info)
        print(text)
        if args.json:
            Path(args.json).write_text(json.dumps({"info": info, "results": results}, indent=1))
        if args.write:
            write_section(text)
    finally:
        common.remove(work)
    return 0


# ------------------------------------------------------------------ where a step's time goes (py-spy)

# A sample's phase is that of its deepest frame that names one (leaf first): an op inside a
# Linear is "forward", the same op under torch.autograd is "backward".
PHASES = [
    ("collator / data", ("tuiapp/trainer/dataset/packing.py", "tuiapp/trainer/dataset/data.py", "data_collator", "torch/utils/data/",
                         "llamafactory/data/collator")),
    ("callbacks", ("tuiapp/trainer/loop/callbacks.py", "tuiapp/trainer/loop/early_stop.py", "trainer_callback.py",
                   "llamafactory/train/callbacks")),
    ("optimizer + clipping", ("torch/optim/", "clip_grad", "deepspeed/runtime/zero", "deepspeed/ops/", "lr_scheduler")),
    ("backward", ("torch/autograd/", "_tensor.py:backward", "backward (torch/_tensor.py")),
    ("forward (model + loss)", ("transformers/models/", "peft/tuners/", "torch/nn/modules/", "torch/nn/functional",
                                "loss_utils", "masking_utils", "integrations/sdpa")),
    ("DeepSpeed engine (other)", ("deepspeed/",)),
    ("Trainer / accelerate loop", ("transformers/trainer", "accelerate/")),
]


def phase_of(stack: str) -> str:
    for frame in reversed(stack.split(";")):
        for name, markers in PHASES:
            if any(m in frame for m in markers):
                return name
    return "other"


def profile_table(raw: dict[str, Path], steps: dict[str, int], tokens: dict[str, int]) -> str:
    """ms per optimizer step in each phase, from py-spy's raw (collapsed) stacks of the training window."""
    names = [name for name, _ in PHASES] + ["other"]
    per_tool = {}
    for tool, path in raw.items():
        counts: dict[str, int] = {}
        for line in path.read_text(errors="replace").splitlines():
            stack, _, count = line.rpartition(" ")
            if not count.isdigit() or "_inner_training_loop" not in stack:
                continue  # only samples inside the training loop
            counts[phase_of(stack)] = counts.get(phase_of(stack), 0) + int(count)
        per_tool[tool] = counts
    rows = []
    for name in names:
        cells = []
        for tool, counts in per_tool.items():
            ms = 1000 * counts.get(name, 0) / PROFILE_RATE / max(1, steps[tool])
            share = 100 * counts.get(name, 0) / max(1, sum(counts.values()))
            cells.append(f"{ms:.0f} ms ({share:.0f}%)")
        rows.append([name, *cells])
    rows.append(["in the training loop", *[f"{1000 * sum(c.values()) / PROFILE_RATE / max(1, steps[t]):.0f} ms"
                                           for t, c in per_tool.items()]])
    rows.append(["non-padding tokens per step", *[f"{tokens[t] / max(1, steps[t]):.0f}" for t in per_tool]])
    fwd_bwd = ("forward (model + loss)", "backward")
    rows.append(["forward + backward per 1k tokens", *[
        f"{1e6 * sum(c.get(n, 0) for n in fwd_bwd) / PROFILE_RATE / max(1, tokens[t]):.0f} ms" for t, c in per_tool.items()]])
    rows.append(["everything else per 1k tokens", *[
        f"{1e6 * sum(v for n, v in c.items() if n not in fwd_bwd) / PROFILE_RATE / max(1, tokens[t]):.0f} ms"
        for t, c in per_tool.items()]])
    return md_table(["phase, per optimizer step", *per_tool], rows)


PROFILE_RATE = 50


def _spy(pid: int, out: Path) -> subprocess.Popen:
    spy = Path(sys.executable).parent / "py-spy"
    return subprocess.Popen([str(spy), "record", "--format", "raw", "--rate", str(PROFILE_RATE), "--nonblocking",
                             "--pid", str(pid), "--output", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)


def _find(match, timeout: float = 300) -> int | None:
    import psutil

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for process in psutil.process_iter(["pid", "cmdline"]):
            if match(process.info.get("cmdline") or []):
                return process.pid
        time.sleep(0.2)
    return None


def profile(rows: list[str], model_dir: Path, data: Path, work: Path, env: dict) -> str:
    """One run of llmtui per row and one of LLaMA-Factory (the first row's settings), each with
    py-spy on its training process; the phase table."""
    import threading

    raw, steps, tokens, spies = {}, {}, {}, []

    def attach(column, match):
        pid = _find(match)
        if pid:
            spies.append(_spy(pid, raw[column]))

    def watched(column, match, run):
        raw[column] = work / f"{len(raw)}.raw"
        watcher = threading.Thread(target=attach, args=(column, match))
        watcher.start()
        result = run()
        watcher.join()
        steps[column], tokens[column] = result["steps"] or 1, result["tokens"] or 0

    for row in rows:
        folder = work / f"p-llmtui-{row}"
        watched(f"llmtui ({row})", lambda c, f=str(folder): any(a.startswith("--local_rank") for a in c)
                and "tuiapp.trainer" in c and f in " ".join(c),
                lambda r=row, f=folder: run_llmtui(model_dir, data, ROWS[r][1], f, env))
    folder = work / "p-peer"
    watched(f"LLaMA-Factory ({rows[0]})", lambda c: any(a.endswith("runner.py") for a in c) and str(folder) in " ".join(c),
            lambda: run_peer(model_dir, data, ROWS[rows[0]][2], folder, env))
    for spy in spies:
        spy.wait(timeout=120)
    missing = [t for t, p in raw.items() if not p.exists()]
    if missing:
        return f"profile: py-spy recorded nothing for {', '.join(missing)}"
    return profile_table(raw, steps, tokens)


def _info(started: float, env: dict, load_start: str, command: str, threads: list[int], records: int = 0) -> dict:
    return {"command": command, "records": records, "minutes": (time.time() - started) / 60, "peer": peer_version(), "commit": _commit(),
            "threads": " and ".join(map(str, threads)), "load_start": load_start,
            "load_end": " ".join(f"{x:.2f}" for x in os.getloadavg())}


def _has_token_batches() -> bool:
    from tuiapp.core.config.recipe import TrainSpec

    return "batching" in TrainSpec.model_fields


def _commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=common.ROOT, capture_output=True, text=True)
    return out.stdout.strip() or "?"


if __name__ == "__main__":
    sys.exit(main())
