"""RunDir: every file and folder of a run by what it is, and the one parse of the frozen recipe."""

import os
import time

import pytest

from tuiapp.core.common.errors import RunError
from tuiapp.core.config.frozen import frozen_recipe
from tuiapp.core.config.recipe import parse_recipe
from tuiapp.core.run_folder import events, rundir
from tuiapp.core.run_folder.rundir import RunDir
from tuiapp.core.store.runs import RunStore


def _paths(folder: RunDir) -> dict[str, object]:
    return {name: getattr(folder, name) for name in dir(RunDir) if isinstance(getattr(RunDir, name), property)}


def test_every_path_is_inside_the_run_and_every_name_has_a_path(tmp_path):
    folder = RunDir(tmp_path)
    paths = _paths(folder)
    assert len(set(paths.values())) == len(paths), "two attributes give one path"
    assert all(p.is_relative_to(tmp_path) for p in paths.values())
    # every file or folder name rundir declares is the name of one of RunDir's paths
    declared = {v for k, v in vars(rundir).items() if k.isupper() and isinstance(v, str)}
    reached = {p.name for p in paths.values()} | {rundir.SUPERVISOR_LOCK, rundir.CHECKPOINT_STATE_JSON}
    assert declared - reached == set()
    assert folder.final_info == tmp_path / "final" / "llmtui.json"
    assert folder.checkpoint(7) == tmp_path / "checkpoints" / "checkpoint-7"
    assert folder.node_record(2).name == "2.json" and folder.node_supervisor_log(2).name == "2.supervisor.log"
    assert folder.lock() == tmp_path / rundir.SUPERVISOR_LOCK and folder.lock(3) == tmp_path / "nodes" / "3.lock"
    assert folder.lock(0) == folder.lock() == rundir.lock_path(tmp_path)
    assert rundir.phase_path(tmp_path, 1) == folder.phase(1) and rundir.stack_path(tmp_path, 1) == folder.stack(1)
    assert os.fspath(folder) == str(tmp_path) and RunDir(str(tmp_path)) == folder


def test_rank_logs_are_named_as_the_launcher_names_them(tmp_path):
    folder = RunDir(tmp_path)
    assert folder.rank_log(0) is None and folder.rank_logs() == []
    folder.ranks.mkdir()
    older = folder.new_rank_log(0, now=time.time() - 3600)
    newer = folder.new_rank_log(0)
    other = folder.new_rank_log(1)
    for path in (older, newer, other):
        path.write_text("x")
    assert folder.rank_log(0) == newer and folder.rank_log(1) == other and folder.rank_log(2) is None
    assert folder.rank_logs() == sorted([older, newer, other])


def test_the_frozen_recipe_is_parsed_in_one_place_and_a_missing_one_names_the_file(tmp_path):
    run = RunStore(tmp_path).create(parse_recipe('name = "demo"\n[method]\nkind = "lora"\n'))
    assert run.dir == RunDir(run.path) and run.dir.recipe_toml.is_file()
    assert frozen_recipe(run.dir).name == "demo" == run.recipe().name == frozen_recipe(run.path).name
    run.dir.recipe_toml.unlink()
    with pytest.raises(RunError) as caught:
        run.recipe()
    assert caught.value.file == str(run.dir.recipe_toml)


def test_event_kinds():
    assert events.kind({"event": events.FINISHED}) == "finished"
    assert events.kind({"step": 3}) is None and events.kind("not a dict") is None
    assert set(events.END_KINDS) <= events.KINDS and set(events.OUTCOMES) == set(rundir.FINAL)
    assert len(events.KINDS) == len({k for k, v in vars(events).items() if k.isupper() and v in events.KINDS})
