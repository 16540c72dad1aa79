"""llama.cpp's convert_hf_to_gguf.py, run from a llama.cpp folder with what llmtui adds to the GGUF:

    python -m tuiapp.trainer.tools.gguf_convert LLAMA_CPP_DIR [--pre NAME] [--eot-id N] [--chat-template-file F]
        -- MODEL_DIR --outfile OUT.gguf --outtype q8_0

- `--pre`: the pre-tokenizer to write when the converter does not recognise the tokenizer by its
  hash (only then; see tuiapp.trainer.tools.gguf.pre_tokenizer_name).
- `--eot-id`: tokenizer.ggml.eot_token_id, the token that ends an assistant turn (<|im_end|>,
  <|eot_id|>, <end_of_turn>), so llama.cpp stops there as transformers does, when the converter
  wrote none.
- `--chat-template-file`: tokenizer.chat_template, in place of the tokenizer's own (the template
  llmtui trained with, without transformers-only tags).

A separate process: the converter puts its folder on sys.path and keeps global state.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

from tuiapp.core.common import trainer_tools


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(prog=trainer_tools.prog("gguf_convert"))
    parser.add_argument("llama_cpp", type=Path)
    parser.add_argument("--pre", default=None)
    parser.add_argument("--eot-id", type=int, default=None)
    parser.add_argument("--chat-template-file", type=Path, default=None)
    args = parser.parse_args(argv[:cut])
    folder = args.llama_cpp.resolve()
    sys.path.insert(0, str(folder))
    sys.path.insert(1, str(folder / "gguf-py"))
    spec = importlib.util.spec_from_file_location("convert_hf_to_gguf", folder / "convert_hf_to_gguf.py")
    converter = importlib.util.module_from_spec(spec)
    sys.modules["convert_hf_to_gguf"] = converter
    spec.loader.exec_module(converter)
    import gguf

    text_model = getattr(converter, "TextModel", None)
    if text_model is None:
        from conversion.base import TextModel as text_model  # llama.cpp's layout since its split into modules
    known = text_model.get_vocab_base_pre

    def get_vocab_base_pre(self, tokenizer) -> str:
        try:
            return known(self, tokenizer)
        except NotImplementedError:
            if not args.pre:
                raise
            print(f"llmtui: the converter does not know this tokenizer by its hash; its tokenizer.json declares "
                  f"GPT-2's byte-level pre-tokenizer, written as '{args.pre}'", file=sys.stderr, flush=True)
            return args.pre

    text_model.get_vocab_base_pre = get_vocab_base_pre
    template = args.chat_template_file.read_text(encoding="utf-8") if args.chat_template_file else None
    write_header = gguf.GGUFWriter.write_header_to_file

    def with_llmtui_keys(self, *a, **kw):
        present = set().union(*(kv.keys() for kv in self.kv_data))
        if args.eot_id is not None and gguf.Keys.Tokenizer.EOT_ID not in present:
            self.add_eot_token_id(args.eot_id)
        if template:  # replaces the tokenizer's own
            self.kv_data[0].pop(gguf.Keys.Tokenizer.CHAT_TEMPLATE, None)
            self.add_chat_template(template)
        return write_header(self, *a, **kw)

    gguf.GGUFWriter.write_header_to_file = with_llmtui_keys
    sys.argv = [str(folder / "convert_hf_to_gguf.py"), *argv[cut + 1:]]
    converter.main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
