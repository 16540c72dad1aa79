"""The tools `llmtui export --gguf` uses, set up once for this Python (`make gguf`; `make test` too):

- llama-cpp-python (the optional `gguf` extra's pin), which runs the parity check and quantizes. It
  publishes only its source on PyPI and compiles llama.cpp on install; this builds it for the CPU with
  only what llmtui uses (no server, tools, examples or multimodal) and keeps the wheel in
  $LLMTUI_CACHE/gguf, so the next install takes seconds;
- llama.cpp's converter (convert_hf_to_gguf.py with its gguf-py) from the same source archive,
  unpacked into $LLMTUI_CACHE/gguf/llama_cpp_python-VERSION/vendor/llama.cpp, where the export finds
  it without --llama-cpp (tuiapp.core.after.gguf_tools.bundled_llama_cpp).

    python tools/gguf_setup.py install   # build when no wheel is cached, install it, unpack the converter
    python tools/gguf_setup.py start     # only the build, in the background at the lowest priority
    python tools/gguf_setup.py wait      # wait for start's build, then install as `install` does

`make test` starts the build before the test run and installs it for the GGUF tests after, so the
compile uses the CPU the other tests leave idle. A machine without a C++ compiler gets a clear line;
the GGUF tests then skip with theirs. Exit codes: 0 done (or nothing to do), 1 a step failed.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tuiapp.core.after.gguf_tools import CONVERTER, converter_home  # noqa: E402
from tuiapp.core.common.built_folder import build_once  # noqa: E402
from tuiapp.core.machine.procs import process_alive  # noqa: E402

# A CPU build of what the bindings load: the core library and ggml's CPU backend.
CMAKE_ARGS = ("-DGGML_NATIVE=OFF -DGGML_OPENMP=OFF -DGGML_BACKEND_DL=OFF -DGGML_CPU_ALL_VARIANTS=OFF "
              "-DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF "
              "-DLLAMA_CURL=OFF -DLLAVA_BUILD=OFF")
# what the converter needs from the source archive's vendor/llama.cpp
CONVERTER_PARTS = (CONVERTER, "convert_lora_to_gguf.py", "conversion", "gguf-py", "requirements",
                   "requirements.txt", "LICENSE")


def pinned_version() -> str:
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gguf"]
    return next(re.split("==", item)[1] for item in extra if item.startswith("llama-cpp-python=="))


def home(version: str) -> Path:
    return converter_home(version).parents[1]  # $LLMTUI_CACHE/gguf/llama_cpp_python-VERSION


def log_path(version: str) -> Path:
    return home(version) / "build.log"


def cached_wheel(version: str) -> Path | None:
    return next(iter(sorted((home(version) / "wheels").glob(f"llama_cpp_python-{version}-*.whl"))), None)


def source_archive(version: str) -> Path:
    """llama-cpp-python's source archive from the package index, once."""
    folder = home(version)
    found = sorted(folder.glob(f"llama_cpp_python-{version}.tar.gz"))
    if found:
        return found[0]
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                    "-d", str(folder), f"llama-cpp-python=={version}"], check=True)
    return sorted(folder.glob(f"llama_cpp_python-{version}.tar.gz"))[0]


def build_command(version: str, archive: Path) -> list[str]:
    return [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-cache-dir", "-w", str(home(version) / "wheels"),
            str(archive)]


def build_env() -> dict:
    cores = os.cpu_count() or 1
    return {**os.environ, "CMAKE_ARGS": CMAKE_ARGS, "CMAKE_BUILD_PARALLEL_LEVEL": str(cores)}


def unpack_converter(version: str, archive: Path) -> Path:
    """The converter's files out of the archive's vendor/llama.cpp (once)."""
    target = converter_home(version)
    prefix = f"llama_cpp_python-{version}/vendor/llama.cpp/"

    def build(folder: Path) -> None:
        with tarfile.open(archive) as tar:
            members = [m for m in tar.getmembers() if m.name.startswith(prefix) and
                       m.name[len(prefix):].split("/", 1)[0] in CONVERTER_PARTS and (m.isfile() or m.isdir())]
            for member in members:
                member.name = member.name[len(prefix):]
            tar.extractall(folder, members=members, filter="data")

    return build_once(target, build, lambda path: (path / CONVERTER).is_file() and (path / "gguf-py").is_dir())


def install(version: str, build: bool = True) -> int:
    archive = source_archive(version)
    wheel = cached_wheel(version)
    if wheel is None and not build:
        print(f"gguf: llama-cpp-python {version} did not build (see {log_path(version)})", file=sys.stderr)
        return 1
    if wheel is None:
        print(f"building llama-cpp-python {version} (compiles llama.cpp for the CPU: minutes)", flush=True)
        with open(log_path(version), "ab") as log:
            done = subprocess.run(build_command(version, archive), env=build_env(), stdout=log, stderr=subprocess.STDOUT)
        wheel = cached_wheel(version)
        if done.returncode != 0 or wheel is None:
            print(f"gguf: llama-cpp-python {version} did not build (see {log_path(version)}); the GGUF export's "
                  "parity check and its tests need it", file=sys.stderr)
            return 1
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gguf"]
    others = [item for item in extra if not item.startswith("llama-cpp-python")]
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", str(wheel), *others], check=True)
    folder = unpack_converter(version, archive)
    print(f"gguf: llama-cpp-python {version} installed; llama.cpp's converter in {folder}")
    return 0


def start(version: str) -> int:
    """The build alone, in its own session at the lowest priority; `wait` picks it up."""
    if cached_wheel(version) is not None:
        return 0
    archive = source_archive(version)
    log = open(log_path(version), "ab")  # noqa: SIM115 (the child owns it)
    process = subprocess.Popen(["nice", "-n", "19", *build_command(version, archive)], env=build_env(), stdout=log,
                               stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    (home(version) / "build.pid").write_text(str(process.pid))
    print(f"gguf: building llama-cpp-python {version} in the background (pid {process.pid}, log {log_path(version)})")
    return 0


def wait(version: str, timeout_s: float) -> int:
    pid_file = home(version) / "build.pid"
    if pid_file.is_file():
        pid = int(pid_file.read_text())
        deadline = time.monotonic() + timeout_s
        while process_alive(pid, None) and time.monotonic() < deadline:
            time.sleep(2)
        pid_file.unlink(missing_ok=True)
        if process_alive(pid, None):
            os.killpg(pid, signal.SIGKILL)
            print(f"gguf: the build took over {timeout_s:.0f}s and was stopped (see {log_path(version)})",
                  file=sys.stderr)
            return 1
        return install(version, build=False)  # the background build's wheel, or why there is none
    return install(version)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools/gguf_setup.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("install", "start", "wait"))
    parser.add_argument("--timeout", type=float, default=3600, help="wait: the longest the build may take (s)")
    args = parser.parse_args(argv)
    if shutil.which("cmake") is None and shutil.which("c++") is None:
        print("gguf: no C++ compiler here, so llama-cpp-python cannot build; the GGUF tests will skip",
              file=sys.stderr)
        return 0
    version = pinned_version()
    home(version).mkdir(parents=True, exist_ok=True)
    try:
        return {"install": lambda: install(version), "start": lambda: start(version),
                "wait": lambda: wait(version, args.timeout)}[args.action]()
    except subprocess.CalledProcessError as exc:
        print(f"gguf: {' '.join(map(str, exc.cmd[:6]))} ... failed with code {exc.returncode}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
