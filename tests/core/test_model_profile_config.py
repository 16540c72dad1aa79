"""A model folder's config.json, read and sanity-checked before anything launches (core only)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tuiapp.core.plan.model_profile import config_problems

ROOT = Path(__file__).resolve().parents[2]
GOOD = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "vocab_size": 100}


def folder_with(tmp_path: Path, text: str) -> Path:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(text)
    return tmp_path / "model"


@pytest.mark.parametrize("text, needle", [
    (json.dumps(GOOD)[:30], "is not valid JSON (line 1, column"),
    (json.dumps({**GOOD, "hidden_size": -5}), "hidden_size = -5 is not a positive whole number"),
    (json.dumps({**GOOD, "num_hidden_layers": 0}), "num_hidden_layers = 0"),
    (json.dumps({**GOOD, "vocab_size": "many"}), "vocab_size = 'many'"),
    (json.dumps({k: v for k, v in GOOD.items() if k != "model_type"}), "has no model_type"),
    ("[1, 2]", "holds no JSON object"),
])
def test_a_damaged_config_is_named_with_its_file_and_a_fix(tmp_path, text, needle):
    folder = folder_with(tmp_path, text)
    [problem] = config_problems(folder)
    assert problem.level == "error" and needle in problem.message and str(folder / "config.json") in problem.message
    assert problem.fix


def test_a_sound_config_has_no_problems(tmp_path):
    assert config_problems(folder_with(tmp_path, json.dumps(GOOD))) == []


def test_llmtui_model_refuses_a_damaged_config_with_exit_2(tmp_path):
    folder = folder_with(tmp_path, json.dumps(GOOD)[:30])
    done = subprocess.run([sys.executable, "-m", "tuiapp.cli", "model", str(folder), "--json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    error = json.loads(done.stdout)["error"]
    assert "is not valid JSON" in error["message"] and "download or save the model again" in error["fix"]
    missing = subprocess.run([sys.executable, "-m", "tuiapp.cli", "model", str(tmp_path / "nope")], cwd=ROOT,
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "neither a local model folder" in missing.stderr and "fix:" in missing.stderr
