"""Every wait says what it waits for and for how long: `llmtui run`'s start-up phase line carries a
clock, redrawn in place on a terminal and repeated in a log; the project's pyproject.toml gives
setuptools nothing to warn about."""

from __future__ import annotations

import io
import warnings
from pathlib import Path

from tuiapp.cli.run import OPS_NOTE, PHASE_REPEAT_S, PhaseClock, phase_line

ROOT = Path(__file__).resolve().parents[1]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_phase_line_gives_the_phase_its_clock_and_what_building_ops_is():
    assert phase_line("tokenizing", 1000.0, None, 1042.5) == "starting: tokenizing 0:42"
    assert phase_line(None, None, None, 5.0) == "starting: launching"
    line = phase_line("building ops", 1000.0, None, 1125.0)
    assert line.startswith("starting: building ops 2:05 (") and OPS_NOTE in line and "make install" in line
    assert phase_line("joining ranks", 0.5, "rank 1 not joined", 61.0).endswith("1:00 — ! rank 1 not joined")


def test_on_a_terminal_the_phase_line_is_redrawn_in_place_and_ended_before_other_lines():
    out = Terminal()
    clock = PhaseClock(out)
    clock.show("starting: importing 0:01", True, 100.0)
    assert not clock.due(100.5) and clock.due(101.0)
    clock.show("starting: importing 0:02", False, 101.0)
    clock.show("starting: building ops 0:00", True, 101.5)
    clock.say("step 1/10 loss 7.5")
    assert out.getvalue() == ("\r\033[Kstarting: importing 0:01\r\033[Kstarting: importing 0:02\n"
                              "\r\033[Kstarting: building ops 0:00\nstep 1/10 loss 7.5\n")


def test_in_a_log_the_phase_line_repeats_every_few_seconds_without_carriage_returns():
    out = io.StringIO()
    clock = PhaseClock(out)
    clock.show("starting: importing 0:01", True, 100.0)
    assert not clock.due(100.0 + PHASE_REPEAT_S - 1) and clock.due(100.0 + PHASE_REPEAT_S)
    clock.show("starting: importing 0:11", False, 110.0)
    assert out.getvalue() == "starting: importing 0:01\nstarting: importing 0:11\n"


def test_pyproject_has_an_spdx_license_and_a_setuptools_that_reads_it_without_a_warning():
    from setuptools.config.pyprojecttoml import read_configuration

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a SetuptoolsDeprecationWarning of the project's own file fails here
        data = read_configuration(ROOT / "pyproject.toml")
    assert data["project"]["license"] == "Apache-2.0"
    assert any(r.replace(" ", "").startswith("setuptools>=77") for r in data["build-system"]["requires"])


def test_the_checks_before_launch_say_so_with_a_clock_then_end_their_line():
    import time

    from tuiapp.cli.run import CHECKING, waiting_clock

    out = Terminal()
    with waiting_clock(CHECKING, out):
        time.sleep(1.3)  # one redraw after the first second
    text = out.getvalue()
    assert text.startswith(f"\r\033[K{CHECKING} 0:00\r\033[K{CHECKING} 0:01") and text.endswith("\n")


def test_llmtui_run_names_its_checks_before_their_findings(tmp_path, llmtui_cache):
    """Through the real command in a pipe: the checking line, then preflight's verdict (a dry run)."""
    import subprocess
    import sys

    from tuiapp.cli.run import CHECKING

    recipe = tmp_path / "r.toml"
    recipe.write_text('name = "r"\n[model]\nname = "tiny"\n[dataset]\nname = "demo:facts"\n[method]\nkind = "sft"\n'
                      '[train]\nmax_steps = 1\n[launch]\ngpus = 1\n')
    done = subprocess.run([sys.executable, "-m", "tuiapp.cli", "run", "--dry-run", str(recipe)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert lines[0] == f"{CHECKING} 0:00" and "preflight: ok" in lines[1:], done.stderr
