"""`llmtui export-metrics RUN --tensorboard DIR`: a run's metrics.jsonl as TensorBoard event files.

    python -m tuiapp.trainer.tools.tb_export RUN_DIR --out DIR

Written with the same writer and tag names as a live run's `report_to = ["tensorboard"]`
(torch's SummaryWriter, transformers' train/... and eval/... tags), at each row's own step and
wall time, into DIR/<run id>/, so several runs exported to one DIR show as separate runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tuiapp.core.common import trainer_tools
from tuiapp.core.run_folder.metrics import JsonlReader, as_number, dedupe_steps, eval_rows, peak_memory, train_rows
from tuiapp.core.run_folder.rundir import RunDir

# metrics.jsonl key -> the tag transformers' TensorBoardCallback gives the same value
TRAIN_TAGS = {"loss": "train/loss", "lr": "train/learning_rate", "grad_norm": "train/grad_norm",
              "epoch": "train/epoch"}
SKIP = {"time", "step", "max_steps", "split", "mem", "samples"}


def scalars(row: dict) -> dict[str, float]:
    """The tags and values of one metrics row."""
    out: dict[str, float] = {}
    evaluating = row.get("split") == "eval"
    for key, value in row.items():
        number = as_number(value)
        if key in SKIP or number is None:
            continue
        if evaluating:
            tag = "eval/" + (key[len("eval_"):] if key.startswith("eval_") else key)
        else:
            tag = TRAIN_TAGS.get(key, f"train/{key}")
        out[tag] = number
    if not evaluating:
        peak = peak_memory(row)
        if peak is not None:
            out["memory/peak_bytes"] = peak
    return out


def export(run_dir: Path, out: Path) -> tuple[Path, int]:
    """Write the event files; (their folder, number of scalars written)."""
    from torch.utils.tensorboard import SummaryWriter

    records = JsonlReader(RunDir(run_dir).metrics).read_all()
    rows = sorted(dedupe_steps(train_rows(records)) + dedupe_steps(eval_rows(records)),
                  key=lambda r: (as_number(r.get("step")) or 0, r.get("split") == "eval"))
    folder = Path(out) / Path(run_dir).name
    writer = SummaryWriter(log_dir=str(folder))
    written = 0
    try:
        for row in rows:
            step = int(as_number(row.get("step")) or 0)
            when = as_number(row.get("time"))
            for tag, value in scalars(row).items():
                writer.add_scalar(tag, value, step, walltime=when)
                written += 1
    finally:
        writer.close()
    return folder, written


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog=trainer_tools.prog("tb_export"))
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    folder, written = export(args.run_dir, args.out)
    print(f"wrote {written} scalars of {args.run_dir.name} to {folder} (tensorboard --logdir {args.out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
