"""The machine a run uses: GPUs, processes, shared memory, the runs folder's lock, desktop notices."""
