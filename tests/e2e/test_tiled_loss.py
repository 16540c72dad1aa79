"""train.tiled_loss through DeepSpeed's real launcher on 2 CPU ranks: the same losses and grad norms as
the model's own loss, at ZeRO-3 (the lm_head's weight gathered again for each slice, in the forward and
in the recomputing backward) and under sequence parallelism (each shard's targets, shift_labels).

One launch of 2 ranks trains the four configurations one after the other (tests/e2e/sp_configs.py).
Tolerance: the tiled loss sums per slice what transformers' loss sums at once; measured to agree to
about 1e-7 relative. rel=1e-5 fails a slice dropped, a position counted twice, or a wrong divisor.
"""

from __future__ import annotations

import pytest

from tests.e2e.test_sequence_parallel import launch, rows

pytestmark = pytest.mark.slow

STEPS = 2
# (ZeRO stage, sequence parallel degree): each trained with and without the tiled loss
PAIRS = [(3, 1), (0, 2)]


def recipe_text(zero: int, degree: int, tiled: bool) -> str:
    return f"""name = "tiled"
[model]
name = "tiny"
[dataset]
name = "demo:chat"
[method]
kind = "sft"
[train]
max_steps = {STEPS}
micro_batch = 2
learning_rate = 3e-3
warmup_ratio = 0.0
max_seq_len = 96
sequence_parallel = {degree}
tiled_loss = {str(tiled).lower()}
[launch]
gpus = 2
zero_stage = {zero}
"""


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from tuiapp.core.plan.launcher import free_port

    root = tmp_path_factory.mktemp("tiled-loss")
    dirs = []
    for zero, degree in PAIRS:
        for tiled in (False, True):
            run_dir = root / "runs" / f"z{zero}-sp{degree}-{'tiled' if tiled else 'plain'}"
            run_dir.mkdir(parents=True)
            (run_dir / "recipe.toml").write_text(recipe_text(zero, degree, tiled))
            dirs.append(run_dir)
    job = launch(dirs, 2, free_port())
    try:
        job.wait(timeout=900)
    finally:
        if job.poll() is None:
            job.kill()
    return dirs


@pytest.mark.parametrize("index", range(len(PAIRS)), ids=[f"zero{z}-sp{d}" for z, d in PAIRS])
def test_tiled_loss_matches_the_models_own(trained, index):
    plain, tiled = rows(trained[2 * index]), rows(trained[2 * index + 1])
    assert [r["step"] for r in tiled] == [r["step"] for r in plain] == list(range(1, STEPS + 1))
    for a, b in zip(tiled, plain, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5), (a["step"], a["loss"], b["loss"])
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4), (a["step"], a["grad_norm"], b["grad_norm"])
    assert (trained[2 * index + 1] / "final").is_dir()
