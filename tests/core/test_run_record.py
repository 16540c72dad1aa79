"""run.json's typed record (rundir.RunRecord): what is read is written back unchanged, a damaged
file still lists, and writes take declared keys only."""

import json
from pathlib import Path

import pytest

from tuiapp.core.config.recipe import parse_recipe
from tuiapp.core.run_folder import rundir
from tuiapp.core.run_folder.rundir import RunRecord
from tuiapp.core.store.runs import Run, RunStore

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "runs"


def realistic() -> dict:
    """A run.json as a supervisor leaves it after a resume, with a key this llmtui does not know."""
    return {
        "id": "20260101-000000-demo-abcd", "name": "demo", "status": "stopped", "created": 1.5, "host": "box",
        "recipe_file": None, "method": "lora", "model": "tiny", "dataset": "demo", "trust_remote_code": False,
        "recipe": {"name": "demo", "method": {"kind": "lora"}},
        "attempts": [{"number": 1, "started": 2.0, "ended": 9.0, "outcome": "stopped", "reason": "stopped on request",
                      "host": "box", "resumed": False},
                     {"number": 2, "started": 20.0, "ended": None, "outcome": None, "reason": None, "host": "box",
                      "resumed": True}],
        "pid": 4242, "pgid": 4242, "pid_create_time": 19.5, "started": 20.0, "ended": None, "exit_code": None,
        "reason": None, "error": None, "phase": None, "phase_since": 20.0, "hang": None, "stop_requested": 25.0,
        "queue": {"priority": 1, "slots": 2, "enqueued": 1.0, "devices": 1}, "devices": [0],
        "argv": ["deepspeed", "-m", "tuiapp.trainer.run"], "ranks": 2, "gpus": [0, 1], "accelerator": "cuda",
        "resumed": True, "master_port": 29500, "slurm": {"nodes": 1},
        "from_a_newer_llmtui": {"kept": [1, 2]},
    }


def test_round_trip_keeps_every_key_null_ones_and_unknown_ones_included():
    data = realistic()
    record = RunRecord.from_json(data)
    assert record.pid == 4242 and record.status == "stopped" and record.attempts[1]["resumed"] is True
    assert record.extra == {"from_a_newer_llmtui": {"kept": [1, 2]}} and not record.damaged
    assert record.to_json() == data
    assert json.dumps(record.to_json(), sort_keys=True) == json.dumps(data, sort_keys=True)


@pytest.mark.parametrize("run_dir", sorted(p for p in FIXTURES.iterdir() if (p / rundir.RUN_JSON).is_file()),
                         ids=lambda p: p.name)
def test_the_recorded_fixture_runs_round_trip(run_dir):
    data = json.loads((run_dir / rundir.RUN_JSON).read_text())
    assert RunRecord.from_json(data).to_json() == data
    assert rundir.record_of(data) is not None


def test_a_value_set_later_is_written_and_none_set_is_written_as_null():
    record = RunRecord.from_json({"status": "created"})
    record.set(pid=7, reason=None)
    assert record.to_json() == {"status": "created", "pid": 7, "reason": None}
    assert RunRecord(status="running").to_json() == {"status": "running"}  # unset keys are not written


def test_orphans_stay_in_memory():
    record = RunRecord(status="running", orphans=True)
    assert "orphans" not in record.to_json() and "orphans" not in rundir.RUN_KEYS


def test_damaged_values_load_without_raising_and_are_written_back_as_read(tmp_path):
    damaged = {"status": "running", "name": "broken", "attempts": "x", "pid": "abc", "error": ["not", "a", "dict"],
               "hang": 3, "recipe": "no", "group": [1], "created": "yesterday", "nodes": {"0": 1}}
    record = RunRecord.from_json(damaged)
    assert record.pid is None and record.attempts is None and record.error is None and record.recipe is None
    assert record.damaged == sorted(set(damaged) - {"status", "name"})
    assert rundir.attempts_of(record) == [] and rundir.duration_s(record) is None
    assert record.to_json() == damaged  # nothing lost when saved back
    assert rundir.record_of(damaged) is None  # not the protocol's types

    store = RunStore(tmp_path)
    folder = tmp_path / "20260101-000000-broken-0001"
    folder.mkdir()
    (folder / rundir.RUN_JSON).write_text(json.dumps(damaged))
    (tmp_path / "20260101-000001-list-0002").mkdir()
    (tmp_path / "20260101-000001-list-0002" / rundir.RUN_JSON).write_text("[1, 2]")
    (tmp_path / "20260101-000002-junk-0003").mkdir()
    (tmp_path / "20260101-000002-junk-0003" / rundir.RUN_JSON).write_text("{not json")
    runs = {run.id: run for run in store.list()}
    assert runs["20260101-000000-broken-0001"].name == "broken"
    assert runs["20260101-000001-list-0002"].status == "unknown"
    assert "unreadable" in runs["20260101-000002-junk-0003"].record.reason

    run = Run(folder).load()
    run.update(status="failed")  # a write keeps the damaged keys as they were
    assert json.loads((folder / rundir.RUN_JSON).read_text()) == {**damaged, "status": "failed"}


def test_update_refuses_an_undeclared_key(tmp_path):
    run = RunStore(tmp_path).create(parse_recipe('name = "demo"\n[method]\nkind = "lora"\n'))
    before = run.record_path.read_text()
    with pytest.raises(KeyError, match="not a run.json key"):
        run.update(stauts="running")
    with pytest.raises(KeyError, match="not a run.json key"):
        run.record.set(orphans=True)
    assert run.record_path.read_text() == before


def test_the_helpers_read_the_record():
    record = RunRecord.from_json(realistic())
    assert rundir.attempt_count(record) == 2 and rundir.first_started(record) == 2.0
    assert rundir.duration_s(record, now=30.0) == 7.0  # the open attempt of a stopped run counts nothing
    closed = rundir.close_attempt(record, "failed", "boom", now=30.0)
    assert closed[-1]["ended"] == 30.0 and closed[-1]["outcome"] == "failed"
    assert rundir.new_attempt(RunRecord(), "h", False, now=1.0)[0]["number"] == 1
