"""What a GGUF export needs, found before any work (pure: files, installed packages, no torch):
llama.cpp's converter (a folder the user names, or the one beside llama-cpp-python), the
architecture in its registry, llama-quantize (or llama-cpp-python's binding) for k-quants, and
llama-cpp-python for the parity check. The CLI refuses with the fix before anything starts; the
export tool (tuiapp.trainer.tools.publish) checks the architecture of the model it will convert."""

from __future__ import annotations

from pathlib import Path

from tuiapp.core.common.errors import UserError

DIRECT = {"f32": "f32", "f16": "f16", "bf16": "bf16", "q8_0": "q8_0"}  # the converter writes these itself
QUANTIZED = ("q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k_s", "q3_k_m", "q3_k_l", "q4_k_s", "q4_k_m", "q5_k_s",
             "q5_k_m", "q6_k")  # llama-quantize (or llama-cpp-python's binding) from an f16/f32 file
CONVERTER = "convert_hf_to_gguf.py"


# llama.cpp's converter reads these architectures' vocabulary only from a SentencePiece model file
# (conversion/gemma.py); transformers 5 saves a tokenizer as tokenizer.json alone, so a run's final/
# has that file only when the trainer kept the base model's (tuiapp.trainer.models.model.keep_sentencepiece).
SENTENCEPIECE_MODEL = "tokenizer.model"
SENTENCEPIECE_ARCHITECTURES = {"GemmaForCausalLM", "Gemma2ForCausalLM"}


class ToolError(UserError):
    """What is missing to export a GGUF, with the fix (refused before any work)."""

    def __init__(self, message: str, fix: str):
        super().__init__(message=message, fix=fix)


def parse_quants(text: str) -> list[str]:
    quants = [q.strip().lower() for q in text.split(",") if q.strip()]
    bad = [q for q in quants if q not in DIRECT and q not in QUANTIZED]
    if not quants or bad:
        raise ToolError(f"--gguf: unknown type {', '.join(bad) or '(none)'}",
                        f"use a comma-separated list of {', '.join([*DIRECT, *QUANTIZED])}")
    return list(dict.fromkeys(quants))


def converter_home(version: str) -> Path:
    """Where tools/gguf_setup.py (`make gguf`) unpacks the converter of llama-cpp-python `version`'s
    source archive (its vendor/llama.cpp)."""
    from tuiapp.core.common.built_folder import cache_root

    return cache_root() / "gguf" / f"llama_cpp_python-{version}" / "vendor" / "llama.cpp"


def bundled_llama_cpp() -> Path | None:
    """llama.cpp's converter of the installed llama-cpp-python: the one `make gguf` unpacked, or
    one beside the package (an install from its source folder keeps vendor/llama.cpp)."""
    import importlib.util

    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.origin:
        return None
    package = Path(spec.origin).parent
    version = llama_cpp_python()
    candidates = [converter_home(version)] if version and version != "unknown" else []
    for folder in (*candidates, package / "vendor" / "llama.cpp", package.parent / "vendor" / "llama.cpp"):
        if (folder / CONVERTER).is_file():
            return folder
    return None


def find_quantize(llama_dir: Path) -> Path | None:
    import shutil

    for path in (llama_dir / "build" / "bin" / "llama-quantize", llama_dir / "llama-quantize",
                 llama_dir / "bin" / "llama-quantize"):
        if path.is_file() and path.stat().st_mode & 0o111:
            return path
    found = shutil.which("llama-quantize")
    return Path(found) if found else None


def llama_cpp_python() -> str | None:
    """llama-cpp-python's version, when it is installed (it runs the parity check)."""
    import importlib.metadata
    import importlib.util

    if importlib.util.find_spec("llama_cpp") is None:
        return None
    try:
        return importlib.metadata.version("llama_cpp_python")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def converter_version(llama_dir: Path) -> str:
    """Which llama.cpp converted: its git commit, else the llama-cpp-python that vendors it."""
    import subprocess

    try:
        done = subprocess.run(["git", "-C", str(llama_dir), "describe", "--tags", "--always", "--dirty"],
                              capture_output=True, text=True, timeout=10)
        if done.returncode == 0 and done.stdout.strip():
            return f"llama.cpp {done.stdout.strip()}"
    except (OSError, subprocess.TimeoutExpired):
        pass
    parts = llama_dir.resolve().parts
    for part in parts:
        if part.startswith("llama_cpp_python-"):
            return f"llama.cpp vendored by {part.replace('llama_cpp_python-', 'llama-cpp-python ')}"
    return f"llama.cpp at {llama_dir}"


def supports(llama_dir: Path, architecture: str) -> bool:
    """Whether the converter names this architecture (its model registry is text in its sources)."""
    needle = f'"{architecture}"'
    sources = [llama_dir / CONVERTER, *sorted((llama_dir / "conversion").glob("*.py"))]
    return any(needle in path.read_text(encoding="utf-8", errors="replace") for path in sources if path.is_file())


def check_tools(model_dir: Path | None, quants: list[str], llama_dir: Path | None, parity: bool) -> dict:
    """Everything the export needs, found before any work; ToolError names what is missing and the fix.
    `model_dir` (the folder with the model's config.json) adds the architecture check."""
    import json

    folder = llama_dir or bundled_llama_cpp()
    clone = "git clone https://github.com/ggml-org/llama.cpp (then cmake -B build && cmake --build build " \
            "--target llama-quantize for k-quants)"
    if folder is None:
        raise ToolError("--gguf needs llama.cpp's converter (convert_hf_to_gguf.py), and no llama.cpp folder was "
                        "given or found beside llama-cpp-python", "run `make gguf` in llmtui's folder (llama-cpp-python "
                        f"and its converter), or pass --llama-cpp DIR, a llama.cpp checkout: {clone}")
    folder = Path(folder).expanduser()
    if not (folder / CONVERTER).is_file():
        raise ToolError(f"--llama-cpp {folder}: no {CONVERTER} there", f"name the root of a llama.cpp checkout: {clone}")
    architecture = None
    if model_dir is not None:  # the export tool, which has the model: is its architecture convertible?
        config = json.loads((model_dir / "config.json").read_text()) if (model_dir / "config.json").is_file() else {}
        architecture = (config.get("architectures") or ["?"])[0]
    if architecture is not None and not supports(folder, architecture):
        raise ToolError(f"llama.cpp's converter in {folder} does not support {architecture}",
                        "update llama.cpp (git pull), or export the HF model without --gguf and serve it with "
                        "`llmtui serve` or vLLM")
    import importlib.util

    missing = [name for name in ("sentencepiece", "numpy") if importlib.util.find_spec(name) is None]
    if missing:  # the converter imports them for every model
        raise ToolError(f"llama.cpp's converter needs {', '.join(missing)}, which is not installed",
                        f"pip install {' '.join(missing)} (or pip install -r {folder}/requirements/"
                        "requirements-convert_hf_to_gguf.txt)")
    needs_quantize = [q for q in quants if q in QUANTIZED]
    quantize = find_quantize(folder) if needs_quantize else None
    if needs_quantize and quantize is None and llama_cpp_python() is None:
        raise ToolError(f"--gguf {','.join(needs_quantize)} needs llama-quantize, found neither in {folder} "
                        "(build/bin/) nor on PATH, nor llama-cpp-python", f"build it (cd {folder} && cmake -B build && "
                        "cmake --build build --target llama-quantize), pip install llama-cpp-python, or ask only "
                        f"for {', '.join(DIRECT)}")
    if parity and llama_cpp_python() is None:
        raise ToolError("the parity check runs the GGUF through llama-cpp-python, which is not installed",
                        "pip install llama-cpp-python (it compiles llama.cpp: a few minutes), or pass --no-parity")
    return {"llama_cpp": str(folder), "converter": converter_version(folder), "architecture": architecture,
            "quantize": str(quantize) if quantize else ("llama-cpp-python" if needs_quantize else None),
            "llama_cpp_python": llama_cpp_python()}


def check_vocabulary(architecture: str | None, folders: list[Path]) -> None:
    """An architecture whose vocabulary the converter reads from tokenizer.model, which none of
    `folders` (the run's final model, then its base) has: refused before the merge and conversion."""
    if architecture not in SENTENCEPIECE_ARCHITECTURES:
        return
    if any((Path(folder) / SENTENCEPIECE_MODEL).is_file() for folder in folders):
        return
    where = " nor ".join(str(folder) for folder in dict.fromkeys(map(str, folders)))
    raise ToolError(f"llama.cpp's converter reads {architecture}'s vocabulary from a SentencePiece "
                    f"{SENTENCEPIECE_MODEL}, and neither {where} has one",
                    f"put the base model's {SENTENCEPIECE_MODEL} (in its Hub repo) into {folders[0]}, or export "
                    "without --gguf")


def pre_tokenizer_name(model_dir: Path) -> str | None:
    """The llama.cpp pre-tokenizer a tokenizer.json declares when it is one llama.cpp has by name:
    a lone ByteLevel pre-tokenizer with GPT-2's split pattern is 'gpt-2' (llama-vocab.cpp's name). The converter knows
    tokenizers by a hash of their output on a test text, so a tokenizer trained here (the tiny one)
    is unknown to it even when its pre-tokenizer is GPT-2's."""
    import json

    try:
        pre = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8")).get("pre_tokenizer") or {}
    except (OSError, ValueError):
        return None
    if pre.get("type") == "ByteLevel" and pre.get("use_regex", True):
        return "gpt-2"
    return None
