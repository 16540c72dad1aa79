"""How the training data loader feeds a GPU: worker processes, pinned memory, prefetch.

On a CUDA GPU the micro batches are collated (packing, padding) in worker processes while the
GPU trains on the one before, copied from pinned memory without blocking, with two batches per
worker in flight. On the CPU the ranks use the cores themselves: the main process collates.
A streaming dataset keeps the main process: its workers would each read every shard unless the
shards outnumber them.
"""

from __future__ import annotations

MAX_WORKERS = 4  # collating a micro batch takes milliseconds: a few workers keep ahead of any GPU step
PREFETCH = 2  # batches per worker in flight


def loader_settings(*, cuda: bool, cpus: int, ranks_per_node: int, streaming: bool = False) -> dict:
    """TrainingArguments keywords of the training data loader (pure: the caller says what the machine has)."""
    if not cuda or streaming:
        return {"dataloader_num_workers": 0, "dataloader_pin_memory": cuda}
    spare = max(0, cpus // max(1, ranks_per_node) - 1)  # one core per rank drives its GPU
    workers = min(MAX_WORKERS, spare)
    if workers == 0:
        return {"dataloader_num_workers": 0, "dataloader_pin_memory": True}
    return {"dataloader_num_workers": workers, "dataloader_pin_memory": True,
            "dataloader_prefetch_factor": PREFETCH, "dataloader_persistent_workers": True}
