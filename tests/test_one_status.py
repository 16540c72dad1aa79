"""What a run shows is derived once (tuiapp.core.run_folder.runstate): `llmtui runs --json` and the TUI's history
show every fixture run (succeeded, stopped, failed, a live one and a stalled one, and a starting one
flagged hung) with the same status, and a flag's hint is the same words, each front end adding its
own way to act on it."""

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from tuiapp.core.run_folder import runstate
from tuiapp.core.run_folder.rundir import read_record
from tuiapp.ui.history import HistoryLoader, row_from_record
from tuiapp.ui.run_panes import flag_text

ROOT = Path(__file__).resolve().parents[1]


def test_the_cli_and_the_tui_show_each_run_alike(tmp_path):
    runs = tmp_path / "runs"
    shutil.copytree(ROOT / "tests" / "fixtures" / "runs", runs)
    hung = next(p for p in runs.iterdir() if "halted" in p.name)  # made a start-up that made no progress
    info = json.loads((hung / "run.json").read_text())
    info.update(status="starting", phase="loading model", phase_since=time.time() - 900,  # a new attempt: its
                attempts=[{"started": time.time() - 900}], started=time.time() - 900,  # old steps do not count
                hang={"since": time.time() - 900, "message": "hung in loading model for 15 min"}, host="elsewhere")
    (hung / "run.json").write_text(json.dumps(info))
    done = subprocess.run([sys.executable, "-m", "tuiapp.cli", "--runs-dir", str(runs), "runs", "--json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    cli = {row["id"]: row for row in json.loads(done.stdout)}
    loader = HistoryLoader(runs)
    now = time.time()
    keys = {}
    for run_dir in sorted(p for p in runs.iterdir() if p.is_dir()):
        row = loader.summarize(row_from_record(run_dir, read_record(run_dir / "run.json")))
        view = row.view(now)
        keys[run_dir.name] = view.key
        assert cli[run_dir.name]["shown"]["key"] == view.key, run_dir.name
        if view.flagged:
            said = cli[run_dir.name]["stalled"]
            assert said.startswith(view.hint) and flag_text(view).startswith(view.hint)
    assert keys[hung.name] == "hung" and "llmtui doctor" in cli[hung.name]["stalled"]
    assert {"succeeded", "failed"} <= set(keys.values())
    assert runstate.FLAGS == ("stalled", "hung", "orphaned")
