"""The Export form's GGUF options (types, llama.cpp folder, parity, Ollama name): what the export
will use, or why it would be refused, shown under them as they change (core.after.exporting.gguf_readiness,
the checks `llmtui export --gguf` makes), the same refusal when it starts and nothing written; and a
real q8_0 GGUF export from the form (gguf + slow: `make test` runs it once llama-cpp-python is built)."""

from __future__ import annotations

import asyncio
import importlib.util
import shutil

import pytest
from textual.widgets import Checkbox, Input, Static
from ui_fixtures import REAL_IDS, screen_text, test_app, wait_for

from tests.after_runs import sft_run
from tuiapp.core.after import exporting, gguf_tools
from tuiapp.core.common.errors import UserError
from tuiapp.core.run_folder import exports
from tuiapp.ui.screens.export import ExportScreen, form_words
from tuiapp.ui.screens.home import HomeScreen
from tuiapp.ui.widgets.runs_table import RunsTable

LLAMA_CPP = gguf_tools.bundled_llama_cpp()  # at collection, from the user's cache (`make gguf`), as test_export_gguf


def _text(form, selector: str) -> str:
    return str(form.query_one(selector, Static).render())


def core_line(out, gguf: str, **options) -> str:
    """What core says of these GGUF options (the form shows it in its fields' words, not flags)."""
    try:
        text = exporting.gguf_readiness(exporting.ExportRequest(out=str(out), gguf=gguf, **options))
    except UserError as exc:
        return form_words(f"✗ {exc}")
    return f"✓ {text}"


async def _form(pilot, run_id: str) -> ExportScreen:
    app = pilot.app
    await wait_for(pilot, lambda: isinstance(app.screen, HomeScreen) and app.screen.loaded, what="home")
    app.screen.query_one(RunsTable).move_to_id(run_id)
    await pilot.press("X")
    await wait_for(pilot, lambda: isinstance(app.screen, ExportScreen), what="the form")
    return app.screen


def test_gguf_fields_show_the_tools_or_their_refusal_before_starting(runs_root, tmp_path):
    run_id = REAL_IDS["sft"]
    (runs_root / run_id / "final").mkdir()
    no_llama = tmp_path / "no-llama"
    no_llama.mkdir()
    out = tmp_path / "out"

    async def scenario():
        app = test_app(runs_root, tmp_path, live=False)
        async with app.run_test(size=(80, 24)) as pilot:
            form = await _form(pilot, run_id)
            text = screen_text(app)
            for words in ("gguf", "GGUF types, e.g. q8_0,q4_k_m", "llama", "ollama", "parity check of the GGUF"):
                assert words in text, words
            assert not form.query_one("#export-gguf-check").display  # no GGUF asked for: nothing to say
            form.query_one("#export-out", Input).value = str(out)

            # the types alone: the tools found here, or (the tests' cache has no converter unless `make
            # gguf` filled it) the refusal with its fix, as core words both
            form.query_one("#export-gguf", Input).value = "q8_0,q4_k_m"
            await wait_for(pilot, lambda: _text(form, "#export-gguf-check") == core_line(out, "q8_0,q4_k_m"),
                           what="the tools' line")
            if gguf_tools.bundled_llama_cpp() is None:
                line = _text(form, "#export-gguf-check")
                assert line.startswith("✗ the gguf field needs llama.cpp's converter") and "run `make gguf`" in line
                assert form.query_one("#export-gguf-check").has_class("-refused")

            # an unknown type
            form.query_one("#export-gguf", Input).value = "q8_0,q9"
            await wait_for(pilot, lambda: "✗ the gguf field: unknown type q9" in _text(form, "#export-gguf-check"),
                           what="the type's refusal")
            assert form.query_one("#export-gguf-check").has_class("-refused")

            # a llama.cpp folder without the converter: refused in the form, and again at ctrl+r
            form.query_one("#export-gguf", Input).value = "q8_0"
            form.query_one("#export-llama-cpp", Input).value = "no-llama"  # relative to the app's folder
            await wait_for(pilot, lambda: "no convert_hf_to_gguf.py there" in _text(form, "#export-gguf-check"),
                           what="the folder's refusal")
            line = _text(form, "#export-gguf-check")
            assert f"✗ the llama field {no_llama}: no convert_hf_to_gguf.py there" in line and "fix: " in line
            await pilot.press("ctrl+r")
            await wait_for(pilot, lambda: not form.running and "no convert_hf_to_gguf.py" in _text(form, "#tool-error"),
                           what="the refusal at start")
            assert not out.exists()
            assert not form.query_one("#export-gguf-check").display  # said once: the GGUF line gave way to it

            # parity off, no folder, an Ollama name: the request says so; the line is core's
            form.query_one("#export-llama-cpp", Input).value = ""
            form.query_one("#export-parity", Checkbox).value = False
            form.query_one("#export-ollama", Input).value = "tiny-sft:q8"
            request = form.request()
            assert (request.gguf, request.llama_cpp, request.no_parity, request.ollama) == (
                "q8_0", None, True, "tiny-sft:q8")
            await wait_for(pilot, lambda: _text(form, "#export-gguf-check") == core_line(
                out, "q8_0", no_parity=True, ollama="tiny-sft:q8"), what="the line of parity off and Ollama")
            if gguf_tools.bundled_llama_cpp() is not None and shutil.which("ollama") is None:
                assert "the ollama field needs the ollama command" in _text(form, "#export-gguf-check")
            # Ollama without GGUF types
            form.query_one("#export-gguf", Input).value = ""
            form.query_one("#export-ollama", Input).value = "tiny"
            await wait_for(pilot, lambda: "the ollama field registers the GGUF export" in _text(form, "#export-gguf-check"),
                           what="--ollama without --gguf")

    asyncio.run(scenario())


def test_export_form_with_a_gguf_refusal_80x24(snap_compare, runs_root, tmp_path):
    run_id = REAL_IDS["sft"]
    (runs_root / run_id / "final").mkdir()

    async def run_before(pilot):
        form = await _form(pilot, run_id)
        form.query_one("#export-gguf", Input).value = "q9"
        await wait_for(pilot, lambda: "unknown type q9" in _text(form, "#export-gguf-check"), what="the refusal")

    assert snap_compare(test_app(runs_root, tmp_path, live=False), terminal_size=(80, 24), run_before=run_before)


@pytest.mark.slow
@pytest.mark.gguf
@pytest.mark.skipif(LLAMA_CPP is None or importlib.util.find_spec("llama_cpp") is None,
                    reason="needs llama-cpp-python and its converter (`make gguf`)")
def test_a_real_gguf_export_from_the_form(tmp_path_factory, tmp_path):
    source = sft_run(tmp_path_factory)
    root = tmp_path / "runs"
    shutil.copytree(source, root / source.name)
    run_id = source.name
    out = tmp_path / "gguf-out"

    async def scenario():
        app = test_app(root, tmp_path, live=False)
        async with app.run_test(size=(80, 24)) as pilot:
            form = await _form(pilot, run_id)
            form.query_one("#export-out", Input).value = str(out)
            form.query_one("#export-gguf", Input).value = "q8_0"
            form.query_one("#export-llama-cpp", Input).value = str(LLAMA_CPP)
            await wait_for(pilot, lambda: _text(form, "#export-gguf-check").startswith("✓ GGUF q8_0 with llama.cpp"),
                           what="the tools found")
            await pilot.press("ctrl+r")
            await wait_for(pilot, lambda: form.running, what="running")
            await wait_for(pilot, lambda: not form.running, 900, what="the GGUF export")
            assert _text(form, "#tool-error") == "", _text(form, "#tool-error")
            assert f"{run_id}-q8_0.gguf" in _text(form, "#tool-result")

    asyncio.run(scenario())
    assert (out / f"{run_id}-q8_0.gguf").stat().st_size > 100_000 and (out / "Modelfile").is_file()
    (record,) = exports.made(root / run_id)
    assert record["gguf"] == "q8_0" and record["merged"]
