"""tools/wheelhouse.py (`make wheelhouse`, `make install-offline`): the pip commands it builds, the
pins it checks, and a real partial wheelhouse installed into a fresh venv with the index off."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from tests.tool_scripts import load_tool

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "wheelhouse.py"
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


@pytest.fixture(scope="module")
def wh():
    return load_tool("wheelhouse")


def test_build_commands_for_a_cuda_server(wh, tmp_path):
    commands = wh.build_commands(tmp_path, "3.12", "manylinux_2_28_x86_64", pip=["pip"])
    assert commands[0] == ["pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), str(ROOT)]
    pins = wh.pins(PROJECT["dependencies"])
    assert commands[1] == ["pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path),
                           f"deepspeed=={pins['deepspeed']}", f"rouge-score=={pins['rouge-score']}"]
    download = commands[-1]
    assert download[:6] == ["pip", "download", "-d", str(tmp_path), "--find-links", str(tmp_path)]
    assert download[-2:] == ["-r", str(tmp_path / "requirements.txt")]
    assert "--only-binary=:all:" in download and download[download.index("--python-version") + 1] == "3.12"
    platforms = [download[i + 1] for i, a in enumerate(download) if a == "--platform"]
    assert platforms[0] == "manylinux_2_28_x86_64" and "manylinux_2_5_x86_64" in platforms
    assert {"manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"} <= set(platforms)
    assert "--index-url" not in download  # torch from PyPI: the CUDA build on Linux x86_64
    assert len(commands) == 3


def test_another_torch_index_downloads_torch_alone_from_it(wh, tmp_path):
    url = "https://download.pytorch.org/whl/cu126"
    commands = wh.build_commands(tmp_path, "3.11", "manylinux_2_28_aarch64", torch_index=url, pip=["pip"])
    torch_step = commands[2]
    assert torch_step[:4] == ["pip", "download", "--no-deps", "-d"]
    assert torch_step[-3:] == ["--index-url", url, f"torch=={wh.pins(PROJECT['dependencies'])['torch']}"]
    assert "manylinux2014_aarch64" in torch_step
    assert "--index-url" not in commands[-1]  # the rest from PyPI; torch found in the folder


def test_requirements_name_the_project_and_the_chosen_extras(wh):
    assert wh.requirements_txt([]).splitlines() == [f"llmtui=={PROJECT['version']}", "setuptools>=68"]
    lines = wh.requirements_txt(["qlora", "liger", "vllm"]).splitlines()
    assert PROJECT["optional-dependencies"]["qlora"][0] in lines and "vllm" in lines
    assert PROJECT["optional-dependencies"]["liger"][0] in lines  # pyproject's pinned extra wins over EXTRAS
    with pytest.raises(wh.BadArgs, match="unknown extra 'cuda'"):
        wh.requirements_txt(["cuda"])


def test_flash_without_its_wheel_in_the_folder_is_refused(tmp_path):
    done = subprocess.run([sys.executable, str(TOOL), "build", str(tmp_path / "w"), "--extras", "flash", "--print"],
                          capture_output=True, text=True)
    assert done.returncode == 2 and "flash-attention/releases" in done.stderr
    assert not (tmp_path / "w").exists()


def test_check_finds_every_pin_or_names_the_missing_one(wh, tmp_path):
    for name, version in wh.pins(PROJECT["dependencies"]).items():
        version = version or "99.0"  # a range (typing-extensions>=4.12): any version of it is there
        label = "+cu126" if name == "torch" else ""
        (tmp_path / f"{name.replace('-', '_')}-{version}{label}-py3-none-any.whl").write_bytes(b"")
    (tmp_path / f"llmtui-{PROJECT['version']}-py3-none-any.whl").write_bytes(b"")
    assert wh.missing(tmp_path) == []
    next(tmp_path.glob("peft-*.whl")).unlink()
    (tmp_path / "trl-0.0.1-py3-none-any.whl").write_bytes(b"")
    assert wh.missing(tmp_path) == [f"peft=={wh.pins(PROJECT['dependencies'])['peft']}"]
    next(tmp_path.glob(f"trl-{wh.pins(PROJECT['dependencies'])['trl']}-*.whl")).unlink()
    assert [m.split("==")[0] for m in wh.missing(tmp_path)] == ["peft", "trl"]  # the wrong version is no match


def test_install_turns_the_index_off(wh, tmp_path):
    venv = tmp_path / "venv"
    commands = wh.install_commands(tmp_path / "w", venv, python="python3")
    assert commands[0] == ["python3", "-m", "venv", str(venv)]
    assert commands[1] == [str(venv / "bin" / "python"), "-m", "pip", "install", "--no-index", "--find-links",
                           str(tmp_path / "w"), "-r", str(tmp_path / "w" / "requirements.txt")]


@pytest.mark.slow
def test_a_real_wheelhouse_installs_into_a_fresh_venv_with_the_index_off(wh, tmp_path):
    """The real commands: llmtui's wheel built and two pinned dependencies downloaded for the target
    platform (the index this machine has), then installed from the folder alone into a new venv."""
    house = tmp_path / "wheels"
    deps = wh.pins(PROJECT["dependencies"])
    packages = f"tomli-w=={deps['tomli-w']},orjson=={deps['orjson']}"
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    build = subprocess.run([sys.executable, str(TOOL), "build", str(house), "--python", python, "--packages",
                            packages], capture_output=True, text=True, timeout=600)
    if build.returncode != 0 and ("NewConnectionError" in build.stderr or "No matching distribution" in build.stderr):
        pytest.skip(f"no package index reachable here: {build.stderr[-300:]}")
    assert build.returncode == 0, build.stdout + build.stderr
    assert wh.missing(house, [f"llmtui=={PROJECT['version']}", *packages.split(",")]) == []
    assert "manylinux" in next(house.glob("orjson-*.whl")).name  # a binary wheel for the target, no sdist
    venv = tmp_path / "venv"
    install = subprocess.run([sys.executable, str(TOOL), "install", str(house), "--venv", str(venv), "--no-deps"],
                             capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stdout + install.stderr
    assert "--no-index" in install.stdout
    extra = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--no-index", "--find-links",
                            str(house), *packages.split(",")], capture_output=True, text=True, timeout=600)
    assert extra.returncode == 0, extra.stdout + extra.stderr
    code = ("import json, importlib.metadata as m, tomli_w, orjson; d = m.distribution('llmtui');"
            "print(json.dumps({'version': d.version, 'requires': d.requires,"
            " 'files': [str(f) for f in d.files]}))")
    shown = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    meta = json.loads(shown.stdout)
    assert meta["version"] == PROJECT["version"]
    assert sorted(r.split(";")[0].replace(" ", "") for r in meta["requires"] if "extra ==" not in r) == \
        sorted(r.split("#")[0].replace(" ", "") for r in PROJECT["dependencies"])
    assert "tuiapp/ui/app.tcss" in meta["files"]  # package data travels in the wheel
    assert (venv / "bin" / "llmtui").exists()
