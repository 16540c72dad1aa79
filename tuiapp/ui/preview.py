"""Text of the dataset preview pane: the records as read (core, in-process), and the examples as
the trainer tokenizes them for the method (`llmtui data --json` in a child process: no torch here)."""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

from rich.text import Text

from tuiapp.core.common import trainer_tools
from tuiapp.core.common.errors import UserError
from tuiapp.core.common.methods import is_rl, trains_on_text
from tuiapp.core.config.recipe import parse_recipe
from tuiapp.core.run_folder.rundir import RunDir
from tuiapp.core.store.runs import RunStore

MAX_FIELD = 300


def _short(value) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= MAX_FIELD else text[: MAX_FIELD - 1] + "…"


def rl_dataset_info(spec, base_dir: Path, limit: int = 3):
    """A grpo/rloo dataset as the run reads it: prompts and the columns its rewards read (no
    chat/alpaca format to detect: the policy writes the completions)."""
    from tuiapp.core.data.datasets import DatasetInfo, is_hub_dataset, resolve_source
    from tuiapp.core.prelaunch.rl import prompt_records

    if is_hub_dataset(spec, base_dir):
        return DatasetInfo(source=spec.name, format="prompts", count=None, examples=[], is_hub=True)
    records = prompt_records(spec, base_dir)
    columns = sorted({key for record in records[:50] for key in record})
    return DatasetInfo(source=resolve_source(spec, base_dir).name, format="prompts (the policy writes the answers)",
                       count=len(records), examples=[_rl_example(r) for r in records[:limit]], columns=columns,
                       kind="prompts")


def _rl_example(record: dict) -> dict:
    """{"messages": the prompt's turns, other columns...}: shown as turns, then each column."""
    return {"messages": record.get("prompt") or [], **{k: v for k, v in record.items() if k != "prompt"}}


def dataset_preview(name: str, info, error: str | None) -> str:
    if error:
        return f"{name}\n\n{error}"
    if info is None:
        return name
    count = getattr(info, "count", getattr(info, "num_records", None))
    lines = [
        f"source   {info.source}",
        f"format   {info.format}" + (" (detected)" if not getattr(info, "is_hub", False) else ""),
        f"records  {count if count is not None else 'loaded by the trainer'}",
    ]
    if getattr(info, "columns", None):
        lines.append(f"columns  {', '.join(info.columns)}")
    if getattr(info, "skipped", 0):
        lines.append(f"skipped  {info.skipped} empty records")
    if getattr(info, "is_hub", False):
        lines.append("\nhub datasets are downloaded and previewed by the trainer (`llmtui data RECIPE`)")
    for index, example in enumerate(info.examples or [], start=1):
        lines.append(f"\n— example {index}")
        if isinstance(example, dict):
            for key, value in example.items():
                if value is None:  # a column this record leaves empty (`tools` of a chat without tools)
                    continue
                if key == "messages" and isinstance(value, list):
                    for turn in value:
                        if isinstance(turn, dict):
                            lines.append(f"  {turn.get('role', '?')}: {_short(turn.get('content', ''))}")
                else:
                    lines.append(f"  {key}: {_short(value)}")
        else:
            lines.append(f"  {_short(example)}")
    return "\n".join(lines)


# ---------------------------------------------------------------- as the trainer sees it

TRAINER_VIEW_SHOW = 2  # examples shown
MAX_SEGMENT = 600  # characters of one trained or masked run shown (a pretrain block is long)
TRAINED_STYLE = "bold green"
MASKED_STYLE = "dim"


def read_trainer_view(recipe_toml: str, base_dir: Path, show: int = TRAINER_VIEW_SHOW,
                      timeout_s: float = 180.0, runs_root: Path | None = None) -> tuple[list[dict] | None, str | None]:
    """The first examples as the trainer tokenizes them for this recipe: `llmtui data --json` in a
    child process (torch and the tokenizer stay out of the UI). (examples, None) or (None, error).
    A `run:NAME` model is read from that run's final model in `runs_root`, as the launch resolves it."""
    if runs_root is not None:
        try:
            recipe_toml = _with_run_model(recipe_toml, runs_root)
        except UserError as exc:
            return None, exc.message + (f"\n  fix: {exc.fix}" if exc.fix else "")
    with tempfile.TemporaryDirectory(prefix="llmtui-preview-") as folder:
        path = RunDir(folder).recipe_toml
        path.write_text(recipe_toml, encoding="utf-8")
        try:
            done = subprocess.run(trainer_tools.argv("preview", [str(path), "--json", "--show", str(show)]),
                                  cwd=base_dir, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return None, f"the tokenizer took over {timeout_s:.0f} s; `llmtui data RECIPE` shows the examples"
        except OSError as exc:
            return None, f"cannot run the preview: {exc}"
    try:
        document = json.loads(done.stdout)
    except ValueError:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"preview failed: {tail}"
    if isinstance(document, dict) and "error" in document:
        error = document["error"]
        return None, error.get("message", "error") + (f"\n  fix: {error['fix']}" if error.get("fix") else "")
    return (document if isinstance(document, list) else []), None


def _with_run_model(recipe_toml: str, runs_root: Path) -> str:
    recipe = parse_recipe(recipe_toml, "the form")
    if not recipe.model.name.startswith("run:"):
        return recipe_toml
    recipe.model.name = RunStore(runs_root).resolve_model(recipe.model.name)
    return recipe.to_toml()


def _clip(text: str) -> str:
    return text if len(text) <= MAX_SEGMENT else text[: MAX_SEGMENT // 2] + " … " + text[-MAX_SEGMENT // 2:]


def _sequence(out: Text, example: dict) -> None:
    segments = example.get("segments") or [{"text": example.get("text", ""), "trained": True}]
    for segment in segments:
        if segment.get("trained"):
            out.append(_clip(segment.get("text", "")), style=TRAINED_STYLE)
        else:
            out.append("⟦" + _clip(segment.get("text", "")) + "⟧", style=MASKED_STYLE)
    out.append("\n")


def _counts(example: dict) -> str:
    labels = example.get("labels") or []
    trained = sum(1 for label in labels if label != -100)
    return f"{len(labels)} tokens, {trained} trained" + ("" if trained < len(labels) else " (all)")


def example_heading(kind: str, index: int, example: dict) -> str:
    """'— example 1 · 38 tokens, 4 trained' (a block, a pair, a label, its images); a grpo/rloo
    prompt: '— prompt 1 · 45 tokens; the policy writes the completions'."""
    if "labels" not in example and "input_ids" in example:  # an online-RL prompt: nothing trained yet
        return f"— prompt {index} · {len(example['input_ids'])} tokens; the policy writes the completions"
    what = "block" if trains_on_text(kind) else "pair" if "rejected" in example else "example"
    label = f", label {str(example['label']).lower()}" if "label" in example else ""
    images = len(example.get("images") or [])
    shown = f" · {images} image{'s' if images != 1 else ''}" if images else ""
    return f"— {what} {index} · {_counts(example)}{label}{shown}"


def example_text(example: dict) -> Text:
    """An example's sequence (a pair: chosen, then rejected), trained tokens bright, masked dim."""
    out = Text()
    if "rejected" in example:
        out.append("chosen: ", style="italic")
        _sequence(out, example)
        out.append(f"rejected ({_counts(example['rejected'])}): ", style="italic")
        _sequence(out, example["rejected"])
    else:
        _sequence(out, example)
    return out


def image_caption(image: dict) -> str:
    """'train-0000.png 64x64 PNG' under an image of the preview."""
    return f"{Path(str(image.get('path', ''))).name} {image.get('width')}x{image.get('height')} {image.get('format', '')}"


def trainer_view_text(kind: str, examples: list[dict] | None, error: str | None = None,
                      elapsed_s: float | None = None) -> Text:
    """The examples as the trainer sees them for the method: pretrain text blocks, or chat
    sequences with the trained tokens marked and the masked ones (label -100) dim inside ⟦ ⟧.
    Image chats are drawn below it, each with its images (widgets.example_images)."""
    out = Text()
    out.append(f"as the trainer sees it ({kind})\n", style="bold")
    if error:
        out.append(error + "\n")
        return out
    if examples is None:
        clock = f" {int(elapsed_s) // 60}:{int(elapsed_s) % 60:02d}" if elapsed_s is not None else ""
        out.append(f"tokenizing the first examples…{clock} (`llmtui data RECIPE` in a child process: torch, the "
                   "tokenizer and, for images, the model's processor load first)\n", style=MASKED_STYLE)
        return out
    if trains_on_text(kind):
        out.append("text blocks cut at max_seq_len; every token trained\n", style=MASKED_STYLE)
    elif is_rl(kind):
        out.append("each prompt after the chat template; the completions are sampled and scored by the rewards\n",
                   style=MASKED_STYLE)
    else:
        out.append("trained tokens ", style=MASKED_STYLE)
        out.append("bright", style=TRAINED_STYLE)
        out.append(" · masked (label -100) ", style=MASKED_STYLE)
        out.append("⟦dim⟧", style=MASKED_STYLE)
        out.append("\n")
    if not examples:
        out.append("no examples\n")
    if any(example.get("images") for example in examples):
        out.append("each image's tokens are in the sequence, never trained; the images are drawn beside\n",
                   style=MASKED_STYLE)
    for index, example in enumerate(examples, start=1):
        if example.get("images"):
            continue  # drawn with its images
        out.append(f"\n{example_heading(kind, index, example)}\n", style="bold")
        if "labels" not in example and "input_ids" in example:
            out.append(_clip(example.get("text", "")) + "\n")
            columns = example.get("columns") or {}
            out.append("columns: " + (", ".join(f"{k}={_short(v)}" for k, v in columns.items()) or "none") + "\n",
                       style=MASKED_STYLE)
            continue
        out.append_text(example_text(example))
    return out
