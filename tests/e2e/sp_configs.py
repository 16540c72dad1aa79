"""Test-only rank entry point: train several run folders one after the other in one job.

`python -m tests.e2e.sp_configs --run-dir A --run-dir B ...`, started by DeepSpeed's launcher (or as
one rank): each folder holds a recipe.toml and is trained by the real `tuiapp.trainer.run.train`,
as `python -m tuiapp.trainer` would, so one launch (imports, process group, DeepSpeed's comm op)
serves many configurations. Between them the sequence-parallel groups are released (DeepSpeed
builds them once per process), so are accelerate's shared state and transformers' ZeRO-3 flag, and a failure is written to the folder's `error.txt`, so the test
sees each configuration's outcome.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run-dir", type=Path, action="append", required=True)
    parser.add_argument("--local_rank", "--local-rank", type=int, default=-1)
    args = parser.parse_known_args()[0]
    from accelerate.state import AcceleratorState, GradientState
    from deepspeed.runtime.sequence_parallel import parallel_state_sp
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from tuiapp.trainer import phases
    from tuiapp.trainer.run import train

    for run_dir in args.run_dir:
        phases.start(run_dir)
        try:
            train(run_dir, False)
        except Exception:  # noqa: BLE001 (recorded for the test, then the next configuration)
            (run_dir / f"error-rank{os.environ.get('RANK', '0')}.txt").write_text(traceback.format_exc())
        parallel_state_sp._release_sequence_parallel_groups()
        AcceleratorState._reset_state(reset_partial_state=False)  # the next Trainer's Accelerator: its own plugin
        GradientState._reset_state()
        ALL_ATTENTION_FUNCTIONS._local_mapping.clear()  # Ulysses' wrapper over the last model's heads
        unset_hf_deepspeed_config()  # a ZeRO-3 run's config would build the next model partitioned
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
