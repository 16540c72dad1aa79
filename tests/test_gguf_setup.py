"""tools/gguf_setup.py (`make gguf`, and `make test` before the GGUF tests): the pin it builds, the
converter it unpacks from the source archive where the export finds it, and a background build
that overruns its time being stopped with the whole process group. The real build runs in
`make test` itself, whose GGUF tests need it."""

from __future__ import annotations

import io
import sys
import tarfile
import time
from pathlib import Path

import pytest
import tomllib

from tests.tool_scripts import load_tool
from tuiapp.core.after import gguf_tools
from tuiapp.core.machine.procs import group_processes

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def setup_tool():
    return load_tool("gguf_setup")


def _archive(path: Path, version: str) -> Path:
    files = {"vendor/llama.cpp/convert_hf_to_gguf.py": "ARCHES = [\"LlamaForCausalLM\"]\n",
             "vendor/llama.cpp/conversion/base.py": "res = 'gpt-2'\n",
             "vendor/llama.cpp/gguf-py/gguf/__init__.py": "",
             "vendor/llama.cpp/ggml/src/ggml.c": "int main(void) { return 0; }\n",
             "vendor/llama.cpp/models/ggml-vocab-gpt-2.gguf": "x" * 1000,
             "llama_cpp/__init__.py": ""}
    archive = path / f"llama_cpp_python-{version}.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"llama_cpp_python-{version}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return archive


def test_the_pin_is_the_gguf_extras(setup_tool):
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gguf"]
    assert f"llama-cpp-python=={setup_tool.pinned_version()}" in extra


def test_the_converter_is_unpacked_where_the_export_looks(setup_tool, tmp_path, monkeypatch):
    monkeypatch.setenv("LLMTUI_CACHE", str(tmp_path / "cache"))
    archive = _archive(tmp_path, "9.9.9")
    folder = setup_tool.unpack_converter("9.9.9", archive)
    assert folder == gguf_tools.converter_home("9.9.9")
    assert folder == tmp_path / "cache" / "gguf" / "llama_cpp_python-9.9.9" / "vendor" / "llama.cpp"
    assert (folder / "convert_hf_to_gguf.py").is_file() and (folder / "gguf-py" / "gguf" / "__init__.py").is_file()
    assert not (folder / "ggml").exists() and not (folder / "models").exists()  # only what converting needs
    assert gguf_tools.supports(folder, "LlamaForCausalLM")
    assert gguf_tools.converter_version(folder) == "llama.cpp vendored by llama-cpp-python 9.9.9"
    assert setup_tool.unpack_converter("9.9.9", archive) == folder  # once


@pytest.mark.slow  # waits out a build's time limit: ~3.5 s
def test_an_overrunning_background_build_is_stopped_with_its_group(setup_tool, tmp_path, monkeypatch):
    monkeypatch.setenv("LLMTUI_CACHE", str(tmp_path / "cache"))
    home = setup_tool.home("9.9.9")
    home.mkdir(parents=True)
    (home / "llama_cpp_python-9.9.9.tar.gz").write_bytes(b"")  # the archive is there: no download
    # a stand-in for pip's compile: a parent with a child, both long-lived, in their own session
    monkeypatch.setattr(setup_tool, "build_command", lambda version, archive: [
        sys.executable, "-c", "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
        "'import time; time.sleep(60)']); time.sleep(60)"])
    assert setup_tool.start("9.9.9") == 0
    pid = int((home / "build.pid").read_text())
    time.sleep(1)
    assert setup_tool.wait("9.9.9", timeout_s=1) == 1
    time.sleep(0.5)
    assert not group_processes(pid) and not (home / "build.pid").exists()  # (the stand-in is this test's child:
    # a zombie until reaped, which group_processes leaves out)
