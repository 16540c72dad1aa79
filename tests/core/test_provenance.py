"""provenance.json: gathered at launch without torch, read back for show, compare and reproduce."""

import json
import subprocess
import sys

from tuiapp.core.config.recipe import parse_recipe
from tuiapp.core.run_folder import provenance
from tuiapp.core.store import environment

RECIPE = """
name = "p"
[model]
name = "tiny"
[dataset]
name = "train.jsonl"
eval_split = "heldout.jsonl"
[method]
kind = "sft"
[train]
max_steps = 2
seed = 7
"""


def _files(tmp_path):
    (tmp_path / "train.jsonl").write_text('{"text": "a"}\n', encoding="utf-8")
    (tmp_path / "heldout.jsonl").write_text('{"text": "b"}\n', encoding="utf-8")
    return parse_recipe(RECIPE, "p.toml")


def test_collect_records_versions_machine_data_and_seed(tmp_path):
    recipe = _files(tmp_path)
    record = environment.write(tmp_path, recipe, ["train.max_steps=2"], tmp_path)
    assert json.loads((tmp_path / "provenance.json").read_text()) == json.loads(json.dumps(record))
    assert record["packages"]["torch"].startswith("2.") and "transformers" in record["packages"]
    assert record["torch_cuda"] == record["packages"]["torch"].partition("+")[2] or record["torch_cuda"]
    assert record["seed"] == 7 and record["overrides"] == ["train.max_steps=2"]
    assert record["recipe"]["train"]["max_steps"] == 2
    assert record["machine"]["cores"] >= 1 and record["python"]
    sources = [s["source"] for s in record["data"]]
    assert sources == ["train.jsonl", "heldout.jsonl"]
    assert len(record["data"][0]["files"][0]["sha256"]) == 64
    assert record["llmtui"]["version"]


def test_mismatches_name_each_changed_field(tmp_path):
    recipe = _files(tmp_path)
    then = environment.collect(recipe, [], tmp_path)
    assert provenance.mismatches(then, environment.collect(recipe, [], tmp_path)) == []
    (tmp_path / "train.jsonl").write_text('{"text": "c"}\n', encoding="utf-8")
    changed = json.loads(json.dumps(then))
    changed["packages"]["transformers"] = "0.0.1"
    found = provenance.mismatches(changed, environment.collect(recipe, [], tmp_path))
    assert any(line.startswith("packages.transformers: the run had 0.0.1, here ") for line in found)
    assert any(line.startswith("data.0.files.0.sha256:") for line in found)
    assert len(found) == 2
    assert provenance.mismatches(None, then)[0].startswith("the run has no provenance.json")


def test_show_lines_and_no_record(tmp_path):
    record = environment.collect(_files(tmp_path), ["train.seed=7"], tmp_path)
    text = "\n".join(provenance.lines(record))
    assert "torch " + record["packages"]["torch"] in text and "seed        7" in text
    assert "train.jsonl sha256 " in text and "--set       train.seed=7" in text
    assert "none recorded" in provenance.lines(None)[0]


def test_collecting_imports_no_torch(tmp_path):
    code = ("import sys; from tuiapp.core.store import environment; from tuiapp.core.config.recipe import "
            "load_recipe; environment.collect(load_recipe('recipes/tiny-sft.toml')); "
            "print([m for m in ('torch', 'transformers', 'deepspeed', 'textual') if m in sys.modules])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "[]", done.stderr
