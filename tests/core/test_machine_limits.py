"""What a machine can take: sizes in readable units, memory far beyond it, more CPU ranks than
cores, a full disk that leaves no temp file, and queue claims held while orphaned ranks live."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tuiapp.core.config.recipe import NUMBER_LIMIT, recipe_from_dict
from tuiapp.core.machine.gpus import GpuInfo
from tuiapp.core.plan.estimate import GB, PRESET_CONFIGS, TINY_CONFIG
from tuiapp.core.prelaunch.resources import (
    check_cpu_ranks,
    check_disk,
    check_memory,
    disk_needed_bytes,
    oversubscribe,
    size_text,
)
from tuiapp.core.run_folder.atomic import atomic_write_text
from tuiapp.core.run_folder.metrics import rank_memory_path, write_rank_memory
from tuiapp.core.store import queue


def recipe(**sections):
    return recipe_from_dict({"method": {"kind": "lora"}, **sections})


@pytest.mark.parametrize("n, text", [(0, "0 bytes"), (512, "512 bytes"), (41_000, "41.0 KB"), (3_300_000, "3.3 MB"),
                                     (412e6, "412 MB"), (2.5 * GB, "2.5 GB"), (6.5536e15, "6554 TB")])
def test_sizes_read_in_the_unit_that_shows_them(n, text):
    assert size_text(n) == text


def test_a_tiny_checkpoint_on_a_nearly_full_disk_is_not_zero_gb():
    tiny = recipe(train={"save_total_limit": 2})
    need = disk_needed_bytes(tiny, TINY_CONFIG, cuda=False)
    [finding] = check_disk(tiny, TINY_CONFIG, need // 3, cuda=False)
    assert finding.level == "error" and "0.0 GB" not in finding.message, finding.message
    assert size_text(need) in finding.message and size_text(need // 3) in finding.message


def test_memory_over_twice_the_ram_is_an_error_and_oversubscribe_makes_it_a_warning():
    big = recipe(train={"micro_batch": 64, "max_seq_len": 4096})
    [fits] = check_memory(big, TINY_CONFIG, cuda=False, gpus=[], ram_available=100 * GB)
    assert fits.level == "info"
    [tight] = check_memory(big, TINY_CONFIG, cuda=False, gpus=[], ram_available=10**12 // 10**6)
    assert tight.level == "error" and "over 2x" in tight.message and "--oversubscribe" in tight.fix
    [forced] = oversubscribe([tight])
    assert forced.level == "warning" and forced.message == tight.message


@pytest.mark.parametrize("gpus, words", [(1, "1 CPU rank"), (2, "2 CPU ranks")])
def test_the_ram_estimate_counts_cpu_ranks_in_words(gpus, words):
    """'for 1 CPU rank', 'for 2 CPU ranks' in the form's Checks pane and `llmtui check`, never 'rank(s)'."""
    tiny = recipe(launch={"gpus": gpus})
    [fits] = check_memory(tiny, TINY_CONFIG, cuda=False, gpus=[], ram_available=100 * GB)
    assert fits.message.endswith(f"GB of RAM for {words}") and "(s)" not in fits.message
    [tight] = check_memory(tiny, TINY_CONFIG, cuda=False, gpus=[], ram_available=10**12 // 10**6)
    assert tight.message.startswith(f"memory: {words} need about") and "(s)" not in tight.message


def test_gpu_memory_over_twice_free_is_an_error():
    qwen = recipe(method={"kind": "sft"}, model={"name": "Qwen/Qwen2.5-7B"}, train={"micro_batch": 64})
    small = GpuInfo(0, "NVIDIA T4", 16 * 10**9, 0, [])
    findings = check_memory(qwen, PRESET_CONFIGS["Qwen/Qwen2.5-7B"], cuda=True, gpus=[small])
    assert [f.level for f in findings] == ["error"] and "per GPU, over 2x" in findings[0].message


def test_cpu_ranks_beyond_the_cores_are_refused_locally_only():
    assert check_cpu_ranks(recipe(launch={"gpus": 2}), cores=2) == []
    [finding] = check_cpu_ranks(recipe(launch={"gpus": 1000}), cores=2)
    assert finding.level == "error" and finding.key == "launch.gpus" and "launch.gpus = 2 or fewer" in finding.fix
    assert check_cpu_ranks(recipe(launch={"gpus": 8, "nodes": 2}), cores=2) == []  # checked where the ranks start
    assert oversubscribe([finding])[0].level == "warning"


def test_other_errors_stay_errors_under_oversubscribe():
    from tuiapp.core.common.findings import Finding

    other = Finding("error", "train.precision", "bf16 needs CUDA", "set train.precision = 'fp32'")
    assert oversubscribe([other]) == [other]


def test_numbers_are_bounded_in_python_too():
    with pytest.raises(Exception, match="at most"):
        recipe(train={"max_steps": NUMBER_LIMIT + 1})
    assert recipe(train={"max_steps": NUMBER_LIMIT}).train.max_steps == NUMBER_LIMIT
    assert recipe(train={"learning_rate": 1e-5}).train.learning_rate == 1e-5


def test_a_full_disk_leaves_no_temp_file(tmp_path):
    """ENOSPC for real: the temp file is a link to /dev/full, where every write fails that way."""
    memory = rank_memory_path(tmp_path, 0)
    memory.parent.mkdir()
    temp = memory.with_name(f".{memory.name}.tmp")
    temp.symlink_to("/dev/full")
    with pytest.raises(OSError) as info:
        write_rank_memory(tmp_path, 0, {"rss": 1})
    assert info.value.errno == 28 and not os.path.lexists(temp) and not memory.exists()

    target = tmp_path / "run.json"
    temp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    temp.symlink_to("/dev/full")
    with pytest.raises(OSError):
        atomic_write_text(target, "{}")
    assert not os.path.lexists(temp) and not target.exists()


def test_a_claim_holds_while_the_supervisors_group_lives(tmp_path):
    """The supervisor died (its pid is gone), but a rank of its group lives on: the slot stays taken."""
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        queue.write_claim(tmp_path, "orphaned", [], pid=2**22 + 7, pid_create_time=1.0, pgid=rank.pid)
        assert "orphaned" in queue.claims(tmp_path)
        assert queue.fit(1, cuda_gpus=[], live=queue.claims(tmp_path), slots=1) is None
    finally:
        rank.kill()
        rank.wait()
    assert queue.claims(tmp_path) == {}
    assert not queue.claim_path(tmp_path, "orphaned").exists()


def test_the_ram_check_counts_each_ranks_runtime_and_the_first_tokenization():
    """A rank holds torch, transformers and datasets (~0.6 GB) besides its model, and the rank that
    first caches the data tokenizes in memory: a 1 M-parameter model is not '0.1 GB of RAM'."""
    from tuiapp.core.plan.estimate import (
        CPU_HEAP_RETAINED,
        RANK_RUNTIME_BYTES,
        TOKENIZING_BYTES,
        estimate_recipe,
        format_estimate,
    )

    two = recipe(launch={"gpus": 2})
    est = estimate_recipe(two, TINY_CONFIG, 2, cuda=False)
    assert est.ram_per_rank == RANK_RUNTIME_BYTES + est.total + int(CPU_HEAP_RETAINED * est.memory.activations)
    need = 2 * est.ram_per_rank + TOKENIZING_BYTES
    [fits] = check_memory(two, TINY_CONFIG, cuda=False, gpus=[], ram_available=100 * GB)
    assert f"about {need / GB:.1f} GB of RAM for 2 CPU ranks" in fits.message and need > 1.3 * GB
    [tight] = check_memory(two, TINY_CONFIG, cuda=False, gpus=[], ram_available=int(need))
    assert tight.level == "warning"  # all of it, beyond the usable 90 %
    text = format_estimate(est)
    assert f"RAM per rank {est.ram_per_rank / GB:.1f} GB (runtime and model); the data memory-mapped once cached" in text
    assert "caching it: +0.4 GB in one rank" in text
    streamed = recipe(launch={"gpus": 2}, dataset={"name": "demo:alpaca", "streaming": True},
                      train={"max_steps": 10})
    est = estimate_recipe(streamed, TINY_CONFIG, 2, cuda=False)
    assert est.ram_first_tokenizing == 0 and "the data streamed" in format_estimate(est)
    on_gpu = estimate_recipe(recipe(), TINY_CONFIG, 1, cuda=True)
    assert on_gpu.ram_per_rank == RANK_RUNTIME_BYTES and "RAM per rank 0.6 GB (runtime)" in format_estimate(on_gpu)
