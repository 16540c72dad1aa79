"""Offline install for GPU servers: a folder of every wheel llmtui needs (`make wheelhouse`), copied
to a machine without a package index and installed there with the index off (`make install-offline`).

    python tools/wheelhouse.py build DIR [--python 3.11] [--platform manylinux_2_28_x86_64]
                                         [--extras qlora,liger,vllm,flash] [--torch-index URL] [--print]
    python tools/wheelhouse.py check DIR          # every pin of pyproject.toml has its wheel in DIR
    python tools/wheelhouse.py install DIR [--venv .venv] [--no-deps]
    python tools/wheelhouse.py gpu DIR [--python 3.12]  # make gpu-wheels: the GPU check's optional packages

`build` runs on a machine with the index (any OS, any Python): it makes llmtui's own wheel, builds the
pure-Python dependencies that publish no wheel (deepspeed, rouge-score) into wheels, then lets pip
download everything else as wheels for the target Python and platform (`--only-binary=:all:`), so
nothing on the target is compiled. torch comes from PyPI by default, which for Linux x86_64 is the
CUDA build (with its nvidia-* wheels); `--torch-index https://download.pytorch.org/whl/cu126` takes
another CUDA (or `.../whl/cpu`). DIR/requirements.txt records what was asked for; `install` installs
exactly that with `--no-index --find-links DIR`. Exit codes: 0 done, 1 a step failed (pip's own
message above it) or wheels are missing, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = ROOT / "pyproject.toml"
# Pure-Python dependencies published only as source: built here into py3-none-any wheels.
SDIST_ONLY = ("deepspeed", "rouge-score")
# torch's JIT extension builds (DeepSpeed's ops) import setuptools; Python 3.12 venvs lack it.
RUNTIME_EXTRA = ["setuptools>=68"]
EXTRAS = {  # extra -> packages, when pyproject.toml does not define the extra itself
    "liger": ["liger-kernel"],
    "vllm": ["vllm"],
    "flash": ["flash-attn"],  # no wheel on PyPI: one must be in DIR already (see FLASH_HELP)
}
FLASH_HELP = ("flash-attn publishes no wheels on PyPI: put the wheel for your torch, CUDA and Python "
              "(https://github.com/Dao-AILab/flash-attention/releases) into {dir} first")
EXIT_OK, EXIT_FAILED, EXIT_BAD_ARGS = 0, 1, 2
# `make gpu-wheels`: what bench/gpu_check.py installs on a GPU box without an index, in order of value,
# each kept only while the folder stays under GPU_WHEELS_MIB (what a device run carries)
GPU_WHEELS = (("liger", "liger-kernel"), ("fp8", "torchao"), ("qlora", "bitsandbytes==0.50.2"))
GPU_WHEELS_MIB = 60
# `make gpu-wheels BASE=1`: what a GPU box whose Python has a CUDA torch and nothing else of llmtui's lacks (the
# lent H200's image: torch 2.11, no index), first; names without a pin in pyproject.toml are theirs as installed
# there on 2026-11-28. bench/gpu_box.sh installs them into a folder of their own and runs the check with it.
GPU_BASE = ("transformers", "huggingface_hub", "tokenizers", "peft", "datasets", "trl", "deepspeed", "pydantic",
            "tomli-w", "orjson", "textual", "math-verify", "pydantic-core==2.50.4", "annotated-types==0.8.0",
            "typing-inspection==0.4.5", "typing-extensions==4.16.0", "httpx2==2.16.2", "httpcore2==2.16.2",
            "truststore==0.10.5", "anyio==4.16.0", "idna==3.20", "click==8.5.1", "hf-xet==1.8.0",
            "fsspec==2026.9.0", "dill==0.4.1", "multiprocess==0.70.19", "hjson==3.1.0", "platformdirs==4.14.8",
            "mdit-py-plugins==0.7.0", "linkify-it-py==2.2.0", "uc-micro-py==2.0.0", "latex2sympy2_extended==1.11.0",
            "antlr4-python3-runtime==4.13.2")


class BadArgs(ValueError):
    pass


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def project() -> dict:
    return tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]


def pins(requirements: list[str]) -> dict[str, str | None]:
    """name -> exact version of `name==version` requirements (None for ranges and bare names)."""
    out = {}
    for req in requirements:
        req = req.split(";")[0].split("#")[0].strip()
        match = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*(==\s*([^,\s]+))?", req)
        if match:
            out[normalize(match.group(1))] = match.group(3) if match.group(3) and "," not in req else None
    return out


def extra_packages(extras: list[str]) -> list[str]:
    optional = project().get("optional-dependencies", {})
    out = []
    for extra in extras:
        if extra in optional:
            out += optional[extra]
        elif extra in EXTRAS:
            out += EXTRAS[extra]
        else:
            raise BadArgs(f"unknown extra {extra!r}: choose from {', '.join(sorted(set(optional) | set(EXTRAS)))}")
    return out


def platform_tags(platform: str) -> list[str]:
    """pip's --platform takes exact tags: a manylinux_2_N target also takes every older manylinux wheel."""
    match = re.fullmatch(r"manylinux_2_(\d+)_(\w+)", platform)
    if not match:
        return [platform]
    glibc, arch = int(match.group(1)), match.group(2)
    tags = [f"manylinux_2_{minor}_{arch}" for minor in range(glibc, 4, -1)]
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    tags += [f"{name}_{arch}" for minor, name in legacy.items() if minor <= glibc]
    return tags


def requirements_txt(extras: list[str]) -> str:
    lines = [f"{project()['name']}=={project()['version']}", *RUNTIME_EXTRA, *extra_packages(extras)]
    return "\n".join(lines) + "\n"


def build_commands(dest: Path, python: str, platform: str, extras: list[str] | None = None,
                   torch_index: str | None = None, packages: list[str] | None = None,
                   pip: list[str] | None = None) -> list[list[str]]:
    """The pip commands of `build`, in order (each an argv, run with DS_BUILD_OPS=0).
    `packages` replaces the requirements file (a partial wheelhouse, for a test)."""
    pip = pip or [sys.executable, "-m", "pip"]
    dest = Path(dest)
    deps = pins(project()["dependencies"])
    if not re.fullmatch(r"3\.\d+", python):
        raise BadArgs(f"--python {python!r}: give a version such as 3.11")
    target = ["--only-binary=:all:", "--python-version", python, "--implementation", "cp"]
    for tag in platform_tags(platform):
        target += ["--platform", tag]
    commands = [[*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(dest), str(ROOT)]]
    local = [f"{name}=={deps[name]}" for name in SDIST_ONLY if deps.get(name)]
    if local and packages is None:
        commands.append([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(dest), *local])
    if torch_index and packages is None:
        commands.append([*pip, "download", "--no-deps", "-d", str(dest), *target, "--index-url", torch_index,
                         f"torch=={deps['torch']}"])
    wanted = ["-r", str(dest / "requirements.txt")] if packages is None else list(packages)
    commands.append([*pip, "download", "-d", str(dest), "--find-links", str(dest), *target, *wanted])
    return commands


def install_commands(dest: Path, venv: Path, no_deps: bool = False, python: str | None = None) -> list[list[str]]:
    """Make the venv when it is not there, then install with the index off."""
    commands = []
    if not (venv / "bin" / "python").exists():
        commands.append([python or sys.executable, "-m", "venv", str(venv)])
    cmd = [str(venv / "bin" / "python"), "-m", "pip", "install", "--no-index", "--find-links", str(dest)]
    if no_deps:
        cmd += ["--no-deps", f"{project()['name']}=={project()['version']}"]
    else:
        cmd += ["-r", str(dest / "requirements.txt")]
    commands.append(cmd)
    return commands


def wheel_listing(dest: Path) -> dict[str, set[str]]:
    """name -> versions of the wheels in a folder (local version labels such as +cu126 dropped)."""
    out: dict[str, set[str]] = {}
    for path in Path(dest).glob("*.whl"):
        parts = path.name[:-4].split("-")
        if len(parts) >= 5:
            out.setdefault(normalize(parts[0]), set()).add(parts[1].split("+")[0])
    return out


def missing(dest: Path, requirements: list[str] | None = None) -> list[str]:
    """The pinned requirements (llmtui's own wheel included) that have no wheel in `dest`."""
    meta = project()
    requirements = requirements if requirements is not None else [
        *meta["dependencies"], f"{meta['name']}=={meta['version']}"]
    listing = wheel_listing(dest)
    out = []
    for name, version in pins(requirements).items():
        if name not in listing or (version is not None and version not in listing[name]):
            out.append(f"{name}=={version}" if version else name)
    return out


def run(commands: list[list[str]], env: dict | None = None) -> int:
    for cmd in commands:
        print("+ " + " ".join(cmd), flush=True)
        code = subprocess.run(cmd, cwd=ROOT, env=env).returncode
        if code != 0:
            print(f"wheelhouse: the step above failed (exit {code})", file=sys.stderr)
            return EXIT_FAILED
    return EXIT_OK


def default_platform() -> str:
    return "manylinux_2_28_x86_64"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="fill DIR with every wheel llmtui needs for a target")
    b.add_argument("dir", type=Path)
    b.add_argument("--python", default=f"{sys.version_info.major}.{sys.version_info.minor}",
                   help="target Python (default: this one)")
    b.add_argument("--platform", default=default_platform(), help="target platform tag (default %(default)s: "
                   "glibc 2.28+ x86_64; aarch64: manylinux_2_28_aarch64)")
    b.add_argument("--extras", default="", help="comma-separated: qlora, liger, vllm, flash, tensorboard, wandb, mlflow")
    b.add_argument("--torch-index", default=None, help="index of the torch wheel (default: PyPI, CUDA on Linux x86_64)")
    b.add_argument("--packages", default=None, help=argparse.SUPPRESS)  # a partial wheelhouse (tests)
    b.add_argument("--print", action="store_true", help="print the commands, run nothing")
    c = sub.add_parser("check", help="every pin of pyproject.toml has its wheel in DIR")
    c.add_argument("dir", type=Path)
    i = sub.add_parser("install", help="install from DIR with the index off")
    i.add_argument("dir", type=Path)
    i.add_argument("--venv", type=Path, default=ROOT / ".venv")
    i.add_argument("--no-deps", action="store_true", help="llmtui's wheel alone")
    i.add_argument("--print", action="store_true", help="print the commands, run nothing")
    g = sub.add_parser("gpu", help="the GPU check's optional wheels (liger-kernel, torchao, bitsandbytes) into DIR")
    g.add_argument("dir", type=Path)
    g.add_argument("--python", default="3.12", help="the GPU box's Python (default %(default)s)")
    g.add_argument("--platform", default="manylinux_2_28_x86_64")
    g.add_argument("--print", action="store_true", help="print the commands, run nothing")
    g.add_argument("--base", action="store_true", help="first the packages a box with only torch lacks (GPU_BASE)")
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            return _build(args)
        if args.command == "check":
            return _check(args.dir)
        if args.command == "gpu":
            return _gpu(args)
        commands = install_commands(args.dir, args.venv, args.no_deps)
        if not (args.dir / "requirements.txt").exists() and not args.no_deps:
            raise BadArgs(f"{args.dir}/requirements.txt not found: is {args.dir} a wheelhouse made by "
                          "`make wheelhouse`?")
        if args.print:
            print("\n".join(" ".join(c) for c in commands))
            return EXIT_OK
        return run(commands)
    except BadArgs as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_ARGS


def _build(args) -> int:
    extras = [e.strip() for e in args.extras.split(",") if e.strip()]
    packages = args.packages.split(",") if args.packages else None
    commands = build_commands(args.dir, args.python, args.platform, extras, args.torch_index, packages)
    if "flash" in extras and not list(Path(args.dir).glob("flash_attn-*.whl")):
        raise BadArgs(FLASH_HELP.format(dir=args.dir))
    if args.print:
        print("\n".join(" ".join(c) for c in commands))
        return EXIT_OK
    args.dir.mkdir(parents=True, exist_ok=True)
    (args.dir / "requirements.txt").write_text(requirements_txt(extras), encoding="utf-8")
    code = run(commands, env={**os.environ, "DS_BUILD_OPS": "0"})
    if code == EXIT_OK and packages is None:
        code = _check(args.dir)
    return code


def gpu_wheel_pins() -> list[str]:
    """GPU_WHEELS with pyproject.toml's pins where its extras pin them."""
    optional = project().get("optional-dependencies", {})
    out = []
    for extra, package in GPU_WHEELS:
        pinned = [r for r in optional.get(extra, []) if normalize(re.split(r"[=<>!~\[ ]", r)[0])
                  == normalize(re.split(r"[=<>!~\[ ]", package)[0]) and "==" in r]
        out.append(pinned[0] if pinned else package)
    return out


def gpu_base_pins() -> list[str]:
    """GPU_BASE with pyproject.toml's pins for llmtui's own dependencies."""
    pinned = {normalize(r.split("==")[0]): r for r in project()["dependencies"] if "==" in r}
    return [name if "==" in name else pinned.get(normalize(name), name) for name in GPU_BASE]


def gpu_wheel_command(dest: Path, requirement: str, python: str, platform: str) -> list[str]:
    if normalize(requirement.split("==")[0]) in SDIST_ONLY:  # pure Python, published as source: built here
        return [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                "--wheel-dir", str(dest), requirement]
    return [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
            "--python-version", python, *[a for tag in platform_tags(platform) for a in ("--platform", tag)],
            "--dest", str(dest), requirement]


def _gpu(args) -> int:
    """Each optional package's wheel into DIR while the folder stays under GPU_WHEELS_MIB."""
    import shutil
    import tempfile

    pins = (gpu_base_pins() if args.base else []) + gpu_wheel_pins()
    if args.print:
        print("\n".join(" ".join(gpu_wheel_command(args.dir, p, args.python, args.platform)) for p in pins))
        return EXIT_OK
    args.dir.mkdir(parents=True, exist_ok=True)
    limit = GPU_WHEELS_MIB * 2**20
    for requirement in pins:
        with tempfile.TemporaryDirectory() as tmp:
            if run([gpu_wheel_command(Path(tmp), requirement, args.python, args.platform)],
                   env={**os.environ, "DS_BUILD_OPS": "0"}) != EXIT_OK:
                print(f"gpu-wheels: {requirement}: no wheel downloaded (see pip above); left out", file=sys.stderr)
                continue
            used = sum(w.stat().st_size for w in args.dir.glob("*.whl"))
            for wheel in Path(tmp).glob("*.whl"):
                if used + wheel.stat().st_size > limit:
                    print(f"gpu-wheels: {wheel.name} ({wheel.stat().st_size / 2**20:.0f} MiB) left out: the folder "
                          f"would pass {GPU_WHEELS_MIB} MiB", file=sys.stderr)
                    continue
                shutil.copy2(wheel, args.dir / wheel.name)
                used += wheel.stat().st_size
    wheels = sorted(args.dir.glob("*.whl"))
    total = sum(w.stat().st_size for w in wheels) / 2**20
    print(f"gpu-wheels {args.dir}: {', '.join(w.name for w in wheels)} ({total:.1f} MiB)")
    return EXIT_OK


def _check(dest: Path) -> int:
    gone = missing(dest)
    if gone:
        print(f"wheelhouse {dest}: no wheel for {', '.join(gone)}", file=sys.stderr)
        return EXIT_FAILED
    print(f"wheelhouse {dest}: {len(list(Path(dest).glob('*.whl')))} wheels, every pin of pyproject.toml present")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
