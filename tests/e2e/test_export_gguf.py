"""`llmtui export --gguf` and the parity checks, through the real CLI on finished tiny runs.

- refused before any work, with the fix, when the converter is missing, does not know the
  architecture, or the parity check's llama-cpp-python is not installed;
- the real llama.cpp converter writes a q8_0 GGUF whose metadata carry the chat template (without
  transformers-only tags), the pre-tokenizer, eos and the end-of-turn token; an Ollama Modelfile
  beside it. It needs a llama.cpp folder: $LLMTUI_TEST_LLAMA_CPP (a checkout, or the
  vendor/llama.cpp of llama-cpp-python's source archive), else llama-cpp-python's bundled one;
- the parity of the GGUF through llama-cpp-python (skipped when it is not installed);
- a merged LoRA export answers as the adapter on its base, and a damaged merge fails the check.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.after_runs import lora_run, sft_run
from tests.e2e.helpers import llmtui

pytestmark = [pytest.mark.slow, pytest.mark.gguf]  # make test runs them last, once llama-cpp-python is built
HAS_LLAMA_CPP_PYTHON = importlib.util.find_spec("llama_cpp") is not None


def _llama_cpp_dir() -> Path | None:
    named = os.environ.get("LLMTUI_TEST_LLAMA_CPP")
    if named and (Path(named) / "convert_hf_to_gguf.py").is_file():
        return Path(named)
    from tuiapp.core.after.gguf_tools import bundled_llama_cpp

    return bundled_llama_cpp()


LLAMA_CPP = _llama_cpp_dir()
needs_converter = pytest.mark.skipif(
    LLAMA_CPP is None or importlib.util.find_spec("sentencepiece") is None, reason="needs sentencepiece (pip install "
    "'.[gguf]') and a llama.cpp converter: set LLMTUI_TEST_LLAMA_CPP to a llama.cpp folder (a "
    "checkout, or vendor/llama.cpp from `pip download llama-cpp-python --no-binary :all:`)")
needs_llama_cpp_python = pytest.mark.skipif(
    not HAS_LLAMA_CPP_PYTHON, reason="llama-cpp-python is not installed (pip install llama-cpp-python compiles "
    "llama.cpp; it did not build within 15 minutes on the 2-core test machine)")


def _run_copy(source: Path, tmp_path: Path) -> Path:
    root = tmp_path / "runs"
    root.mkdir()
    shutil.copytree(source, root / source.name)
    return root / source.name


def test_refused_before_any_work_with_the_fix(tmp_path_factory, tmp_path):
    run = _run_copy(sft_run(tmp_path_factory), tmp_path)
    out = tmp_path / "out"

    def export(*args):
        return llmtui("export", run.name, "--out", str(out), *args, runs_dir=run.parent, timeout=300)

    empty = tmp_path / "not-llama"
    empty.mkdir()
    done = export("--gguf", "q8_0", "--llama-cpp", str(empty))
    assert done.returncode == 2 and "no convert_hf_to_gguf.py there" in done.stderr and "fix: " in done.stderr
    assert not out.exists() or not any(out.iterdir())

    old = tmp_path / "old-llama.cpp"  # a converter that knows no Llama
    old.mkdir()
    (old / "convert_hf_to_gguf.py").write_text('ARCHES = ["GPT2LMHeadModel"]\n')
    done = export("--gguf", "q8_0", "--llama-cpp", str(old), "--no-parity")
    assert done.returncode == 2, done.stderr
    if importlib.util.find_spec("sentencepiece") is None:  # the converter's own requirement comes first
        assert "pip install sentencepiece" in done.stderr
    else:
        assert "does not support LlamaForCausalLM" in done.stderr and "fix: update llama.cpp" in done.stderr
    assert not out.exists() or not any(out.iterdir())

    bad = export("--gguf", "q9_z", "--llama-cpp", str(old))
    assert bad.returncode == 2 and "unknown type q9_z" in bad.stderr

    if not HAS_LLAMA_CPP_PYTHON and LLAMA_CPP is not None:
        done = export("--gguf", "q8_0", "--llama-cpp", str(LLAMA_CPP))
        assert done.returncode == 2 and "pip install llama-cpp-python" in done.stderr and "--no-parity" in done.stderr
        assert not out.exists() or not any(out.iterdir())


def _metadata(llama_cpp: Path, gguf: Path) -> dict:
    """The GGUF's metadata, read by llama.cpp's own gguf-py."""
    code = ("import json, sys; from gguf import GGUFReader; r = GGUFReader(sys.argv[1]); "
            "print(json.dumps({k: f.contents() for k, f in r.fields.items() if not k.startswith(('tokenizer.ggml.t', "
            "'tokenizer.ggml.merges'))}, default=str))")
    done = subprocess.run([sys.executable, "-c", code, str(gguf)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(llama_cpp / "gguf-py")})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@needs_converter
def test_q8_0_gguf_with_metadata_and_modelfile(tmp_path_factory, tmp_path):
    run = _run_copy(sft_run(tmp_path_factory), tmp_path)
    out = tmp_path / "out"
    parity = [] if HAS_LLAMA_CPP_PYTHON else ["--no-parity"]
    done = llmtui("export", run.name, "--out", str(out), "--gguf", "q8_0", "--llama-cpp", str(LLAMA_CPP), *parity,
                  runs_dir=run.parent, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    gguf = out / f"{run.name}-q8_0.gguf"
    assert gguf.is_file() and gguf.stat().st_size > 100_000
    meta = _metadata(LLAMA_CPP, gguf)
    tokens = json.loads((out / "tokenizer.json").read_text())["added_tokens"]
    ids = {t["content"]: t["id"] for t in tokens}
    assert meta["general.architecture"] == "llama" and meta["general.file_type"] == 7  # MOSTLY_Q8_0
    assert meta["tokenizer.ggml.pre"] == "gpt-2"  # the name llama.cpp loads
    assert meta["tokenizer.ggml.eos_token_id"] == ids["<|endoftext|>"]
    assert meta["tokenizer.ggml.eot_token_id"] == ids["<|im_end|>"]  # llama.cpp stops at the turn's end
    template = meta["tokenizer.chat_template"]
    assert "<|im_start|>assistant" in template and "{%- generation %}" in (out / "chat_template.jinja").read_text()
    assert "generation %}" not in template  # transformers' {% generation %} tags, unknown to llama.cpp, are gone
    modelfile = (out / "Modelfile").read_text()
    assert modelfile.splitlines()[2] == f"FROM ./{gguf.name}"
    assert 'PARAMETER stop "<|im_end|>"' in modelfile and "PARAMETER num_predict" in modelfile
    record = json.loads((out / "export.json").read_text())
    assert record["gguf"] == {"q8_0": gguf.name} and "llama.cpp" in record["converter"]  # which converter ran
    if HAS_LLAMA_CPP_PYTHON:
        [report] = record["parity"]
        assert report["quant"] == "q8_0" and report["agreement"] >= 0.75 and report["passed"]
        assert "of greedy tokens agree" in done.stdout


@needs_converter
@needs_llama_cpp_python
def test_q4_k_m_through_llama_cpp_python(tmp_path_factory, tmp_path):
    run = _run_copy(sft_run(tmp_path_factory), tmp_path)
    out = tmp_path / "out"
    done = llmtui("export", run.name, "--out", str(out), "--gguf", "q4_k_m", "--llama-cpp", str(LLAMA_CPP),
                  "--parity-min", "0", runs_dir=run.parent, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((out / "export.json").read_text())
    assert record["gguf"] == {"q4_k_m": f"{run.name}-q4_k_m.gguf"} and record["parity"][0]["quant"] == "q4_k_m"
    assert not (out / f".{run.name}-f16.gguf").exists()  # the intermediate file is gone


def test_merged_lora_answers_as_the_adapter_and_a_damaged_merge_fails(tmp_path_factory, tmp_path):
    run = _run_copy(lora_run(tmp_path_factory), tmp_path)
    out = tmp_path / "merged"
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("What is the capital of France?\nWho are you?\n")
    done = llmtui("export", run.name, "--out", str(out), "--merge", "--parity-prompts", str(prompts),
                  runs_dir=run.parent, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "parity merged merged/ (transformers) vs the lora adapter on its base (transformers): 100%" in done.stdout
    [report] = json.loads((out / "export.json").read_text())["parity"]
    assert report["passed"] and [p["prompt"] for p in report["prompts"]] == ["What is the capital of France?",
                                                                               "Who are you?"]

    import torch
    from safetensors.torch import load_file, save_file

    from tuiapp.trainer.tools import export as exporting

    damaged = tmp_path / "damaged"
    shutil.copytree(out, damaged)
    weights = damaged / "model.safetensors"
    tensors = load_file(str(weights))
    generator = torch.Generator().manual_seed(0)
    tensors = {k: (torch.randn(v.shape, generator=generator) if "embed" in k or "lm_head" in k else v)
               for k, v in tensors.items()}
    save_file(tensors, str(weights), metadata={"format": "pt"})
    report = exporting.merged_parity(run / "final", damaged, ["What is the capital of France?", "Who are you?"], "")
    assert not report.passed and report.agreement < 0.9
    assert any(p.first_divergence for p in report.prompts)


def _sentencepiece_model(folder: Path) -> None:
    """A small SentencePiece model, as a Gemma repository ships beside its tokenizer.json."""
    import sentencepiece

    corpus = folder / "corpus.txt"
    corpus.write_text("\n".join(f"the quick brown fox {i} jumps over the lazy dog {i * 7}" for i in range(500)))
    sentencepiece.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(folder / "sp"), vocab_size=80,
                                             model_type="bpe", minloglevel=2)
    (folder / "sp.model").rename(folder / "tokenizer.model")
    for leftover in (corpus, folder / "sp.vocab"):
        leftover.unlink()


@needs_converter
def test_a_gemma2_lora_keeps_the_sentencepiece_model_its_gguf_needs(tmp_path):
    """transformers 5 saves tokenizer.json alone: the run's final/ and the merged export lost the base's
    tokenizer.model, from which llama.cpp's converter reads Gemma 2's vocabulary (it failed after the
    merge). The base here is the zoo's Gemma 2 with a SentencePiece model beside its tokenizer."""
    from tuiapp.trainer.models.zoo import ensure_zoo_model

    base = tmp_path / "gemma2"
    shutil.copytree(ensure_zoo_model("gemma2", tmp_path / "cache"), base)
    _sentencepiece_model(base)
    runs = tmp_path / "runs"
    trained = llmtui("run", "recipes/tiny-lora.toml", "--set", f"model.name={json.dumps(str(base))}", "--set",
                     "train.max_steps=2", "--set", "train.save_steps=0", "--set", "train.eval_steps=0",
                     runs_dir=runs, timeout=600)
    assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-3000:]
    [run] = [p for p in runs.iterdir() if p.is_dir() and not p.name.startswith(".")]
    assert (run / "final" / "tokenizer.model").read_bytes() == (base / "tokenizer.model").read_bytes()

    out = tmp_path / "out"
    done = llmtui("export", run.name, "--out", str(out), "--gguf", "f16", "--llama-cpp", str(LLAMA_CPP),
                  "--no-parity", runs_dir=runs, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (out / "tokenizer.model").is_file()
    meta = _metadata(LLAMA_CPP, out / f"{run.name}-f16.gguf")
    assert meta["general.architecture"] == "gemma2" and meta["tokenizer.ggml.model"] == "llama"  # SentencePiece

    (run / "final" / "tokenizer.model").unlink()  # a final without it, and a base without it: refused first
    (base / "tokenizer.model").unlink()
    again = tmp_path / "again"
    done = llmtui("export", run.name, "--out", str(again), "--gguf", "f16", "--llama-cpp", str(LLAMA_CPP),
                  "--no-parity", runs_dir=runs, timeout=600)
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    assert "reads Gemma2ForCausalLM's vocabulary from a SentencePiece tokenizer.model" in done.stderr
    assert "fix: put the base model's tokenizer.model" in done.stderr and "Traceback" not in done.stderr
    assert not again.exists() or not any(again.iterdir())
