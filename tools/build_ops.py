"""`make install`'s last step: build DeepSpeed's CPU comm op once, where the ranks look for it
(core.plan.launcher.torch_extensions_dir), so that the first run does not compile it (1-2 min, up to
10 on a loaded machine). A clock moves while the compiler works. With CUDA the op is not used: it
says so and builds nothing. A failure is not fatal: it says that the first run will build it."""

from __future__ import annotations

import os
import sys
import threading
import time

TICK_S = 5.0


def main() -> int:
    from tuiapp.core.plan.launcher import torch_extensions_dir

    os.environ["TORCH_EXTENSIONS_DIR"] = torch_extensions_dir()
    import torch

    if torch.cuda.is_available():
        print("DeepSpeed's CPU comm op: not needed with CUDA (GPU ranks use NCCL); nothing to build")
        return 0
    print(f"building DeepSpeed's CPU comm op once, into {os.environ['TORCH_EXTENSIONS_DIR']} "
          "(1-2 min; cached for every later run)", flush=True)
    done = threading.Event()
    failed: list[str] = []

    def build() -> None:
        try:
            from deepspeed.comm.torch import build_shm_op

            build_shm_op()
        except Exception as exc:  # a missing compiler: the first run tries again and says why
            failed.append(f"{type(exc).__name__}: {exc}")
        finally:
            done.set()

    started = time.monotonic()
    threading.Thread(target=build, daemon=True).start()
    while not done.wait(TICK_S):
        elapsed = int(time.monotonic() - started)
        print(f"  building the op… {elapsed // 60}:{elapsed % 60:02d}", flush=True)
    elapsed = time.monotonic() - started
    if failed:
        print(f"could not build it ({failed[0][:200]}); the first run will build it (its start-up shows "
              "`building ops` with a clock)", flush=True)
        return 0
    print(f"built in {elapsed:.0f} s" if elapsed > 2 else "already built (cached)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
