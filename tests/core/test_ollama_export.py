"""`llmtui export --gguf ... --ollama NAME`: refused before any work without --gguf, with a name Ollama
refuses, or without the ollama command; after the export, `ollama create NAME -f OUT/Modelfile` runs in
the export folder. The ollama command here is a small script on PATH that records how it was called
(Ollama itself cannot be installed on this machine)."""

import json
import os
import stat

import pytest

from tuiapp.core.after import exporting
from tuiapp.core.common.errors import RunError, UserError


def _fake_ollama(folder, code=0, said=""):
    script = folder / "ollama"
    script.write_text("#!/usr/bin/env python3\nimport json, os, sys\n"
                      f"open({str(folder / 'called.json')!r}, 'w').write(json.dumps({{'argv': sys.argv[1:], "
                      "'cwd': os.getcwd()}))\n"
                      f"sys.stderr.write({said!r})\nsys.exit({code})\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def test_refused_before_any_work(tmp_path, monkeypatch):
    out = tmp_path / "export"
    assert exporting.ollama_command(None, "q8_0", out) is None
    with pytest.raises(UserError, match="add --gguf"):
        exporting.ollama_command("mine", None, out)
    with pytest.raises(UserError, match="not an Ollama model name"):
        exporting.ollama_command("bad name!", "q8_0", out)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(UserError) as refused:
        exporting.ollama_command("mine", "q8_0", out)
    assert "not on PATH" in refused.value.message and f"ollama create mine -f {out / 'Modelfile'}" in refused.value.fix


def test_ollama_create_runs_in_the_export_folder(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _fake_ollama(bin_dir)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    out = tmp_path / "export"
    out.mkdir()
    planned = exporting.ExportPlan("run-1", out, [], exporting.ollama_command("facts:q8", "q8_0", out))
    exporting.register_with_ollama(planned)
    called = json.loads((bin_dir / "called.json").read_text())
    assert called == {"argv": ["create", "facts:q8", "-f", str(out / "Modelfile")], "cwd": str(out)}


def test_a_refusal_of_ollama_names_what_it_said(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _fake_ollama(bin_dir, code=1, said="Error: could not connect to ollama app, is it running?\n")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    out = tmp_path / "export"
    out.mkdir()
    planned = exporting.ExportPlan("run-1", out, [], exporting.ollama_command("facts", "q8_0", out))
    with pytest.raises(RunError) as failed:
        exporting.register_with_ollama(planned)
    assert "could not connect" in failed.value.message and "ollama serve" in failed.value.fix
