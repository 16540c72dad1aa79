"""Resume exact at the edges: the metrics of a resumed run are unique by step, and a run resumed from
the checkpoint of its last step trains no further step (it only saves final/).

- The rows an attempt wrote after the checkpoint it resumes from (or every row, when it resumes
  with no checkpoint: killed before the first one) are dropped before training starts, and a
  `metrics_trimmed` event says which: the steps are trained again and their rows written again.
- RunTrainerMixin._run_epoch asks `nothing_left` before each epoch: transformers' loop would train one
  step past max_steps when resumed at max_steps (its stop check follows a step).

`pause_at` is a fault-injection point for the tests (LLMTUI_PAUSE_AT=<point>): rank 0 stops itself
(SIGSTOP) at an exact moment, after writing `<run>/.paused`, so a test can kill the run right there.
Points: `step:N` (step N's metrics row written), `checkpoint:N` (checkpoint-N published), `final`
(final/ saved to its staging folder, not yet renamed into place).
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from tuiapp.core.run_folder import events as ev
from tuiapp.core.run_folder.atomic import atomic_write_text
from tuiapp.core.run_folder.metrics import JsonlWriter, read_jsonl
from tuiapp.core.run_folder.rundir import RunDir

PAUSE_ENV = "LLMTUI_PAUSE_AT"
PAUSED_FILE = ".paused"


def trim_metrics(run_dir: Path, step: int) -> list[int]:
    """Drop the metric rows past `step` (0: all of them); the dropped rows' steps, recorded as an event."""
    path = RunDir(run_dir).metrics
    if not path.exists():
        return []
    rows = read_jsonl(path)
    kept = [r for r in rows if (r.get("step") or 0) <= step]
    if len(kept) == len(rows):
        return []
    dropped = sorted({int(r.get("step") or 0) for r in rows if (r.get("step") or 0) > step})
    atomic_write_text(path, "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in kept))
    with JsonlWriter(RunDir(run_dir).events) as events:
        events.write({"event": ev.METRICS_TRIMMED, "step": step, "rows": len(rows) - len(kept),
                      "steps": [dropped[0], dropped[-1]],
                      "reason": f"resumed from step {step}: the rows of steps {dropped[0]}-{dropped[-1]} written "
                                "after it are trained and written again"})
    return dropped


def nothing_left(state) -> bool:
    """Resumed from the checkpoint of the run's last step: no step is left to train."""
    return 0 < state.max_steps <= state.global_step


def pause_at(point: str, run_dir: Path | str | None) -> None:
    """Stop this process here when LLMTUI_PAUSE_AT names `point` (tests only; see the module doc)."""
    if not run_dir or os.environ.get(PAUSE_ENV) != point:
        return
    Path(run_dir, PAUSED_FILE).write_text(point, encoding="utf-8")
    os.kill(os.getpid(), signal.SIGSTOP)
