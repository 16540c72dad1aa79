"""A SentencePiece tokenizer.model survives into final models and exports.

transformers 5 saves a tokenizer as tokenizer.json alone, so a Gemma run's final/ lost the base's
tokenizer.model, and llama.cpp's converter, which reads Gemma's vocabulary from that file only,
failed after the merge. The real conversion is in tests/e2e/test_export_gguf.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuiapp.core.after.gguf_tools import SENTENCEPIECE_MODEL, ToolError, check_vocabulary
from tuiapp.trainer.models.model import FINAL_INFO, keep_sentencepiece
from tuiapp.trainer.tools.export import export, vocabulary_sources


@pytest.mark.gguf  # sentencepiece comes with the GGUF tools: `make test` runs these last, once installed
def test_transformers_leaves_the_sentencepiece_model_out_of_a_saved_tokenizer(tmp_path):
    """Why the file is copied: this fails once transformers writes it back (then the copy is moot)."""
    sentencepiece = pytest.importorskip("sentencepiece")
    from transformers import AutoTokenizer, GemmaTokenizer

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(f"the quick brown fox {i} jumps over the lazy dog {i * 7}" for i in range(500)))
    sentencepiece.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(tmp_path / "sp"), vocab_size=80,
                                             model_type="bpe", minloglevel=2)
    GemmaTokenizer(vocab_file=str(tmp_path / "sp.model")).save_pretrained(tmp_path / "saved")
    AutoTokenizer.from_pretrained(tmp_path / "saved").save_pretrained(tmp_path / "again")
    assert not (tmp_path / "saved" / SENTENCEPIECE_MODEL).exists()
    assert not (tmp_path / "again" / SENTENCEPIECE_MODEL).exists()


def _model(folder: Path, architecture: str = "Gemma2ForCausalLM", **files) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"architectures": [architecture]}))
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder


def test_the_first_folder_that_has_one_gives_it_and_a_kept_one_is_not_replaced(tmp_path):
    base = _model(tmp_path / "base", **{SENTENCEPIECE_MODEL: "the base's"})
    final = _model(tmp_path / "final")
    keep_sentencepiece(final, None, tmp_path / "nowhere", base)
    assert (final / SENTENCEPIECE_MODEL).read_text() == "the base's"
    (final / SENTENCEPIECE_MODEL).write_text("its own")
    keep_sentencepiece(final, base)
    assert (final / SENTENCEPIECE_MODEL).read_text() == "its own"
    plain = _model(tmp_path / "plain", "LlamaForCausalLM")
    keep_sentencepiece(plain, tmp_path / "nowhere")
    assert not (plain / SENTENCEPIECE_MODEL).exists()


def test_an_export_of_a_run_trained_before_gets_the_base_models_file(tmp_path):
    base = _model(tmp_path / "base", **{SENTENCEPIECE_MODEL: "the base's"})
    final = _model(tmp_path / "run" / "final", **{FINAL_INFO: json.dumps({"method": "sft", "base_model": str(base)})})
    assert vocabulary_sources(final)[-1] == base
    export(final, tmp_path / "out", merge=False)
    assert (tmp_path / "out" / SENTENCEPIECE_MODEL).read_text() == "the base's"


def test_a_gemma_gguf_without_any_sentencepiece_model_is_refused_with_the_fix(tmp_path):
    final, base = _model(tmp_path / "final"), _model(tmp_path / "base")
    with pytest.raises(ToolError) as caught:
        check_vocabulary("Gemma2ForCausalLM", [final, base])
    assert "reads Gemma2ForCausalLM's vocabulary from a SentencePiece tokenizer.model" in caught.value.message
    assert str(final) in caught.value.message and str(base) in caught.value.message
    assert caught.value.fix.startswith(f"put the base model's tokenizer.model (in its Hub repo) into {final}")
    check_vocabulary("LlamaForCausalLM", [final, base])  # read from tokenizer.json: nothing needed
    (base / SENTENCEPIECE_MODEL).write_text("x")
    check_vocabulary("Gemma2ForCausalLM", [final, base])
