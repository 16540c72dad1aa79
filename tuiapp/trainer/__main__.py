"""Entry point of each DeepSpeed rank: `python -m tuiapp.trainer --run-dir DIR [--resume]`."""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from pathlib import Path

from tuiapp.core.config.frozen import frozen_recipe
from tuiapp.core.run_folder import events as ev
from tuiapp.core.run_folder.rundir import RunDir


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="tuiapp.trainer")
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--local_rank", "--local-rank", type=int, default=-1)
    return parser.parse_known_args(argv)[0]


def _recipe(run_dir: Path):
    return frozen_recipe(run_dir)


# trackers whose files are finished by their own exit handlers: a rank that reports to them exits normally
EXIT_HANDLED_TRACKERS = {"wandb", "mlflow"}


def main(argv=None) -> int:
    args = parse_args(argv)
    from tuiapp.trainer import phases

    phases.start(args.run_dir)
    try:
        phases.enter("importing")
        recipe = _recipe(args.run_dir)
        if recipe.launch.strategy == "pipeline":  # its own loop: stages and micro-batches, no Trainer
            from tuiapp.trainer.pipeline.runner import train

            return train(args.run_dir, args.resume)
        from tuiapp.trainer.run import train

        code = train(args.run_dir, args.resume)
        if code == 0 and not EXIT_HANDLED_TRACKERS & set(recipe.train.report_to):
            # every file is written and closed, and every rank has passed the last barrier: the
            # interpreter's teardown of torch, DeepSpeed and the process group only costs seconds
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
        return code
    except BaseException as exc:
        if isinstance(exc, SystemExit) and exc.code in (0, None):
            raise
        rank = int(os.environ.get("RANK", "0"))
        traceback.print_exc()
        message = f"{exc}".strip() or type(exc).__name__
        try:
            from tuiapp.core.run_folder.metrics import JsonlWriter

            with JsonlWriter(RunDir(args.run_dir).events) as events:
                events.write({"event": ev.ERROR, "rank": rank, "type": type(exc).__name__, "message": message[:2000],
                              "phase": phases.current()})
        except OSError:
            pass
        print(f"Error: rank {rank}: {type(exc).__name__}: {message}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        # exit now: tearing down torch, the process group and DeepSpeed after a failure takes seconds
        # (and can hang on a peer that is gone); the launcher ends the other ranks
        os._exit(1)


if __name__ == "__main__":
    sys.exit(main())
