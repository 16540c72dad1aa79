import json
import os
import subprocess
import sys

import pytest

from tuiapp.core.common.errors import RunError
from tuiapp.core.config.recipe import parse_recipe
from tuiapp.core.store.runs import RunStore, redact


def test_create_freezes_recipe_and_writes_run_json(tmp_path):
    store = RunStore(tmp_path)
    run = store.create(parse_recipe('name = "demo"\n[method]\nkind = "lora"\n'), recipe_file="r.toml")
    assert run.path.parent == tmp_path and run.id.split("-")[2] == "demo"
    info = json.loads((run.path / "run.json").read_text())
    assert info["status"] == "created" and info["name"] == "demo"
    assert run.recipe().name == "demo"


def test_get_by_id_prefix_and_name(tmp_path):
    store = RunStore(tmp_path)
    first = store.create(parse_recipe('name = "a"\n[method]\nkind = "lora"\n'))
    second = store.create(parse_recipe('name = "a"\n[method]\nkind = "lora"\n'))
    assert store.get(first.id).path == first.path
    assert store.get("a").path == second.path  # the latest of that name
    with pytest.raises(RunError):
        store.get("nope")


@pytest.mark.parametrize("ref", ["../x", "..", "/etc/passwd", "a/b", "", ".hidden"])
def test_run_refs_cannot_escape_the_runs_dir(tmp_path, ref):
    with pytest.raises(RunError):
        RunStore(tmp_path).get(ref)


def test_status_truth_when_supervisor_is_gone(tmp_path):
    store = RunStore(tmp_path)
    run = store.create(parse_recipe('name = "crash"\n[method]\nkind = "lora"\n'))
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    import psutil

    run.update(status="running", pid=proc.pid, pid_create_time=psutil.Process(proc.pid).create_time())
    (run.path / "stdout.log").write_text("step 1\nTraceback (most recent call last):\nRuntimeError: boom\n")
    assert store.get(run.id).status == "running"
    proc.kill()
    proc.wait()
    again = store.get(run.id)
    assert again.status == "failed"
    assert "RuntimeError: boom" in again.record.reason
    assert json.loads((run.path / "run.json").read_text())["status"] == "failed"


def test_reused_pid_is_not_mistaken_for_the_run(tmp_path):
    store = RunStore(tmp_path)
    run = store.create(parse_recipe('name = "reboot"\n[method]\nkind = "lora"\n'))
    run.update(status="running", pid=os.getpid(), pid_create_time=1.0)  # same pid, other process
    assert store.get(run.id).status == "failed"


def test_unreadable_run_json_does_not_break_listing(tmp_path):
    store = RunStore(tmp_path)
    store.create(parse_recipe('name = "ok"\n[method]\nkind = "lora"\n'))
    broken = tmp_path / "20200101-000000-broken-0000"
    broken.mkdir()
    (broken / "run.json").write_bytes(b"\xff{not json")
    runs = store.list()
    assert {r.status for r in runs} == {"created", "unknown"}


def test_redact_hides_secrets():
    assert redact(["HF_TOKEN=abc", "--api-key", "xyz", "--lr", "1"]) == ["HF_TOKEN=***", "--api-key", "***", "--lr", "1"]


def test_resolve_run_reference(tmp_path):
    store = RunStore(tmp_path)
    with pytest.raises(RunError) as info:
        store.resolve_model("run:base")
    assert info.value.key == "model.name"
    run = store.create(parse_recipe('name = "base"\n[method]\nkind = "lora"\n'))
    (run.path / "final").mkdir()
    run.update(status="succeeded")
    assert store.resolve_model("run:base") == str((run.path / "final").resolve())
    assert store.resolve_model("tiny") == "tiny"


def test_files_follow_the_users_umask(tmp_path):
    old = os.umask(0o077)
    try:
        run = RunStore(tmp_path).create(parse_recipe('name = "private"\n[method]\nkind = "lora"\n'))
        run.update(status="running")
    finally:
        os.umask(old)
    assert (run.path / "run.json").stat().st_mode & 0o777 == 0o600
    assert (run.path / "recipe.toml").stat().st_mode & 0o777 == 0o600
    assert run.path.stat().st_mode & 0o777 == 0o700


def test_failure_reason_explains_a_killed_rank(tmp_path):
    from tuiapp.core.store.runs import failure_reason

    (tmp_path / "stdout.log").write_text(
        "[INFO] step\n[ERROR] [launch.py:259:sigkill_handler] ['python', '-u', '-m', 'tuiapp.trainer', "
        "'--local_rank=1', '--run-dir', '/r'] exits with return code = -9\n")
    reason = failure_reason(tmp_path)
    assert reason.startswith("rank 1: killed by signal 9 (SIGKILL")
    (tmp_path / "ranks").mkdir()
    (tmp_path / "ranks" / "20260101000000_rank0.log").write_text("Traceback (most recent call last):\nValueError: bad\n")
    # the peer's traceback came after the kill: the kill stays the cause
    assert failure_reason(tmp_path).startswith("rank 1: killed by signal 9")
    (tmp_path / "stdout.log").write_text("[INFO] step\n")
    assert failure_reason(tmp_path).startswith("[20260101000000_rank0.log] Traceback")


def test_a_run_folder_appears_only_with_its_run_json(tmp_path):
    """Another process listing the runs (the TUI, `llmtui runs`, the queue) never sees a run
    folder without its run.json, and a taken run id is refused without touching that run."""
    store = RunStore(tmp_path / "runs")
    recipe = parse_recipe('name = "a"\n[method]\nkind = "lora"\n')
    watcher = subprocess.Popen([sys.executable, "-c", (
        "import os, sys, time\n"
        "root, seen, bad = sys.argv[1], 0, []\n"
        "end = time.time() + 60\n"
        "while time.time() < end and not os.path.exists(root + '.done'):\n"
        "    for name in (os.listdir(root) if os.path.isdir(root) else []):\n"
        "        if not name.startswith('.'):\n"
        "            seen += 1\n"
        "            if not os.path.exists(os.path.join(root, name, 'run.json')): bad.append(name)\n"
        "print(seen, len(bad))\n"), str(store.root)], stdout=subprocess.PIPE, text=True)
    for k in range(150):
        store.create(recipe, run_id=f"run-{k:03d}")
    (tmp_path / "runs.done").touch()
    seen, bad = map(int, watcher.communicate(timeout=90)[0].split())
    assert seen > 0 and bad == 0
    with pytest.raises(RunError, match="already exists"):
        store.create(recipe, run_id="run-007")
    assert json.loads((store.root / "run-007" / "run.json").read_text())["id"] == "run-007"
    assert sorted(store.run_names()) == [f"run-{k:03d}" for k in range(150)]
    assert not [p for p in store.root.iterdir() if p.name.startswith(".creating-")]


def test_names_and_notes_with_control_characters_are_refused_from_every_front_end(tmp_path):
    """The TUI's rename and note go through tuiapp.ui.manage to core.store.meta, as the CLI does: an escape
    sequence is refused there, never stored and echoed to a terminal."""
    from tuiapp.core.common.errors import UserError
    from tuiapp.core.store import meta
    from tuiapp.ui import manage

    run = RunStore(tmp_path / "runs").create(parse_recipe('name = "x"\n[method]\nkind = "lora"\n'))
    for change in (lambda: manage.rename(run.path, "x\x1b[2J"), lambda: manage.set_note(run.path, "a\x07b")):
        with pytest.raises(UserError) as refused:
            change()
        assert "control characters" in refused.value.message
    assert meta.read_meta(run.path).get("display_name") is None and not meta.read_meta(run.path).get("note")
    manage.rename(run.path, "plain name\twith a tab")
    assert meta.read_meta(run.path)["display_name"] == "plain name\twith a tab"


@pytest.mark.slow  # over ~3.5 s on 2 busy cores (7.1 s in the fast tier)
def test_show_gives_no_eta_for_a_run_that_has_ended(runs):
    # a stopped run at step 17/400 showed "ETA 8m00s", as if it were still training
    def show(run_id):
        done = subprocess.run([sys.executable, "-m", "tuiapp.cli", "--runs-dir", str(runs), "show", run_id],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return next(line for line in done.stdout.splitlines() if line.strip().startswith("progress"))

    for ended in ("20260101-000258-halted-f005", "20260101-000343-crashed-f006", "20260101-000218-sft-f004"):
        line = show(ended)
        assert "step " in line and "ETA" not in line, line
