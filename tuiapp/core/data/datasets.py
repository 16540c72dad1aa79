"""Find, read and normalise the dataset a recipe names, in pure Python.

Every record becomes one canonical form the trainer tokenizes:
  {"text": str}                                      plain text (pretraining)
  {"messages": [{"role", "content"}], "tools": str|None}   chats
  {"prompt": [turns], "chosen": [turns], "rejected": [turns], "tools"}   preference pairs
  {"prompt": [turns], "completion": [turns], "label": bool, "tools"}     unpaired feedback (KTO)
with roles system, user, assistant, tool_call (trained like assistant) and tool (masked).
Pairs come from TRL's prompt/chosen/rejected (explicit or implicit prompt, text or turns), from
sharegpt or messages records with `chosen` and `rejected` turns, or from alpaca records with
`chosen`/`rejected` in place of `output`; feedback from messages/sharegpt records with a boolean
`label` (or `kto_tag`) judging the last assistant turn, or TRL's prompt/completion/label.
Hub ids are only recognised here; the trainer loads them with `datasets.load_dataset` and
normalises the rows with `normalise_rows`.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tuiapp.core.common.errors import DatasetError, did_you_mean
from tuiapp.core.config.recipe import DatasetSpec
from tuiapp.core.data import datafiles, demo_shapes, images
from tuiapp.core.data.datafiles import Row
from tuiapp.core.data.demo_data import DEMO_DATASETS, DEMO_VERSION, demo_records

SUFFIXES = (".json", ".jsonl", ".csv", ".parquet", ".txt")
FORMATS = ("text", "alpaca", "sharegpt", "messages", "preference", "unpaired")
PAIR_COLUMNS = {"chosen": "chosen", "rejected": "rejected"}
DEFAULT_COLUMNS = {
    "text": {"text": "text"},
    "alpaca": {"prompt": "instruction", "query": "input", "response": "output",
               "system": "system", "history": "history", **PAIR_COLUMNS},
    "sharegpt": {"messages": "conversations", "system": "system", "tools": "tools", **PAIR_COLUMNS,
                 "label": "label", "images": "images"},
    "messages": {"messages": "messages", "tools": "tools", **PAIR_COLUMNS, "label": "label", "images": "images"},
    "preference": {"prompt": "prompt", "system": "system", "tools": "tools", **PAIR_COLUMNS, "images": "images"},
    "unpaired": {"prompt": "prompt", "completion": "completion", "label": "label", "system": "system",
                 "tools": "tools"},
}
REQUIRED_ROLES = {"text": ["text"], "alpaca": ["prompt", "response"],
                  "sharegpt": ["messages"], "messages": ["messages"],
                  "preference": ["chosen", "rejected"], "unpaired": ["prompt", "completion", "label"]}
# what a record is, for the methods: pretraining text, a chat to imitate, a chosen/rejected pair,
# or one answer labelled good or bad
RECORD_KINDS = ("text", "chat", "pairs", "unpaired")
# Role tags used by sharegpt and OpenAI-style data, mapped to canonical roles.
ROLES = {
    "system": "system", "human": "user", "user": "user", "gpt": "assistant",
    "assistant": "assistant", "model": "assistant", "bot": "assistant",
    "function_call": "tool_call", "tool_call": "tool_call",
    "observation": "tool", "tool": "tool", "function": "tool", "ipython": "tool",
}
TRAINED_ROLES = ("assistant", "tool_call")
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
DETECT_ROWS = 50  # rows whose columns decide the format
IMAGE_OPEN_CHECKS = datafiles.SAMPLE_ROWS  # records whose images are decoded by a read (the rest: exist)


@dataclass
class Source:
    """Where records come from: a demo, local files, or a hub id the trainer loads."""

    kind: str  # "demo" | "file" | "folder" | "hub"
    name: str
    files: list[Path] = field(default_factory=list)

    def describe(self) -> str:
        if self.kind == "folder":
            return f"folder {self.name} ({len(self.files)} files)"
        return {"demo": "demo", "file": "file", "hub": "hub dataset"}[self.kind] + f" {self.name}"


@dataclass
class DatasetInfo:
    source: str
    format: str  # detected format, or "auto" for hub datasets not yet loaded
    count: int | None  # number of records; None for hub datasets
    examples: list[dict]
    columns: list[str] = field(default_factory=list)
    skipped: int = 0  # records dropped for empty content
    is_hub: bool = False
    kind: str = ""  # one of RECORD_KINDS ("" for hub datasets not yet loaded)
    size: int = 0  # bytes of the local files
    sampled: bool = False  # a file over datafiles.WHOLE_BYTES was read by a bounded sample: count is estimated
    with_images: int = 0  # records read that carry images


class _Problem(Exception):
    """A bad record; turned into a DatasetError that names the file and line."""

    def __init__(self, message: str, key: str | None = None, fix: str | None = None):
        super().__init__(message)
        self.message, self.key, self.fix = message, key, fix


# ---------------------------------------------------------------- resolving


def resolve_source(spec: DatasetSpec, base_dir: str | Path | None = None) -> Source:
    name = spec.name.strip()
    if name in demo_shapes.DATA_FILES:  # image demos: files drawn once into the cache
        path = demo_shapes.data_file(name)
        return Source("file", str(path), [path])
    if name.startswith("demo:"):
        if name not in DEMO_DATASETS:
            hint = did_you_mean(name, DEMO_DATASETS) or f"use one of: {', '.join(DEMO_DATASETS)}"
            raise DatasetError(message=f"unknown demo dataset '{name}'", key="dataset.name", fix=hint)
        return Source("demo", name)
    path = _local_path(name, base_dir)
    if path.is_file():
        if path.suffix.lower() not in SUFFIXES:
            raise DatasetError(message=f"unsupported file type '{path.suffix}'", file=str(path),
                               fix=f"use one of {', '.join(SUFFIXES)}")
        return Source("file", str(path), [path])
    if path.is_dir():
        return Source("folder", str(path), _folder_files(path, spec.split))
    if HUB_ID.match(name) and Path(name).suffix.lower() not in SUFFIXES:
        return Source("hub", name)
    raise DatasetError(
        message="dataset not found", file=str(path), key="dataset.name",
        fix=f"check the path (relative paths start at {_base(base_dir)}), or use a demo "
        f"({', '.join(DEMO_DATASETS)}) or a hub id like owner/name",
    )


def is_hub_dataset(spec: DatasetSpec, base_dir: str | Path | None = None) -> bool:
    return resolve_source(spec, base_dir).kind == "hub"


def source_fingerprint(spec: DatasetSpec, base_dir: str | Path | None = None) -> dict:
    """What identifies the source's content, for cache keys: demo version, or file stats."""
    source = resolve_source(spec, base_dir)
    if source.kind == "demo":
        return {"demo": source.name, "version": DEMO_VERSION}
    if source.kind == "hub":
        return {"hub": source.name, "split": spec.split}
    stats = [(str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in source.files]
    return {"files": stats}


def _base(base_dir) -> Path:
    return Path(base_dir) if base_dir is not None else Path.cwd()


def _local_path(name: str, base_dir) -> Path:
    path = Path(name).expanduser()
    return path if path.is_absolute() else _base(base_dir) / path


def _folder_files(folder: Path, split: str) -> list[Path]:
    """Supported files of a folder, sorted; those named after the split when there are any."""
    if (folder / split).is_dir():
        folder = folder / split
    files = sorted(p for p in folder.iterdir()
                   if p.is_file() and p.suffix.lower() in SUFFIXES and not p.name.startswith("."))
    if not files:
        raise DatasetError(message=f"no {', '.join(SUFFIXES)} files in this folder", file=str(folder),
                           fix="put data files in it, or name one file directly")
    of_split = [p for p in files if re.match(rf"{re.escape(split)}([-_.]|$)", p.stem)]
    return of_split or files


# ---------------------------------------------------------------- reading


def read_rows(source: Source) -> list[Row]:
    if source.kind == "demo":
        return [Row(r, source.name, None, i) for i, r in enumerate(demo_records(source.name))]
    if source.kind == "hub":
        raise DatasetError(message="hub datasets are read by the trainer (datasets.load_dataset)",
                           file=source.name, fix="run training, or inspect it with the datasets library")
    return [row for path in source.files for row in _read_file(path)]


def sample_rows(source: Source) -> tuple[list[Row], int, int, bool]:
    """(rows, records, bytes, sampled): small files whole, larger ones by a bounded sample
    (datafiles.sample_file); records is then an estimate."""
    if source.kind != "file" and source.kind != "folder":
        rows = read_rows(source)
        return rows, len(rows), 0, False
    rows, records, size, sampled = [], 0, 0, False
    for path in source.files:
        if path.stat().st_size <= datafiles.WHOLE_BYTES:
            part = _read_file(path)
            records += len(part)
        else:
            sample = datafiles.sample_file(path)
            part, sampled = sample.rows, True
            records += sample.records
        size += path.stat().st_size
        rows += part
    return rows, records, size, sampled


def _read_file(path: Path) -> list[Row]:
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        rows = _read_parquet(path)
    else:
        text = _decode(path)
        if suffix == ".txt":
            rows = [Row({"text": line}, str(path), n, 0)
                    for n, line in enumerate(text.splitlines(), start=1) if line.strip()]
        elif suffix == ".csv":
            reader = csv.DictReader(io.StringIO(text))
            rows = [Row(r, str(path), reader.line_num, 0) for r in reader]
        elif suffix == ".jsonl":
            rows = _json_lines(text, path)
        else:
            rows = _json_document(text, path)
    if not rows:
        raise DatasetError(message="file has no records", file=str(path), fix="add records to it")
    for index, row in enumerate(rows):
        row.index = index
    return rows


def _decode(path: Path) -> str:
    text = datafiles.check_text(path.read_bytes(), path)  # NUL bytes and non-UTF-8 refused
    if not text.strip():
        raise DatasetError(message="file is empty", file=str(path), fix="add records to it")
    return text


def _json_lines(text: str, path: Path) -> list[Row]:
    return datafiles.json_lines(text, path, 1, 0)


def _json_document(text: str, path: Path) -> list[Row]:
    """A .json file: one array or object, or else JSON lines."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        if text.lstrip().startswith("["):
            raise DatasetError(message=f"not valid JSON: {exc.msg} (column {exc.colno})",
                               file=str(path), line=exc.lineno,
                               fix="fix the JSON near that line (a missing comma or quote?)") from None
        return _json_lines(text, path)
    records = data if isinstance(data, list) else [data]
    return [Row(record, str(path), None, 0) for record in records]


def _read_parquet(path: Path) -> list[Row]:
    try:
        import pyarrow.parquet as pq  # lazily: only parquet needs it
    except ImportError:
        raise DatasetError(message="reading .parquet needs pyarrow", file=str(path),
                           fix="pip install pyarrow") from None
    try:
        records = pq.read_table(path).to_pylist()
    except Exception as exc:  # pyarrow raises several types for broken files
        raise DatasetError(message=f"not a readable parquet file: {exc}", file=str(path),
                           fix="re-export the file, or convert it to .jsonl") from None
    return [Row(r, str(path), None, 0) for r in records]


# ---------------------------------------------------------------- format


def detect_format(rows: list[dict], spec: DatasetSpec, where: str) -> tuple[str, dict]:
    """The format and the role → column map, from the spec and the first rows' columns."""
    found = sorted({key for row in rows[:DETECT_ROWS] if isinstance(row, dict) for key in row})
    guess = _guess_format(found, spec.columns)
    fmt = guess if spec.format == "auto" else spec.format
    if fmt is None:
        raise DatasetError(
            message=f"cannot tell the format from the columns found: {', '.join(found) or 'none'}",
            file=where, key="dataset.format",
            fix="expected text (text), alpaca (instruction, input, output), sharegpt "
            "(conversations) or messages (messages); or set dataset.columns, e.g. "
            "{prompt='question', response='answer'}",
        )
    columns = {**DEFAULT_COLUMNS[fmt], **spec.columns}
    if "label" not in spec.columns and "label" in columns and "label" not in found and "kto_tag" in found:
        columns["label"] = "kto_tag"  # LLaMA-Factory's name for the KTO label
    required = REQUIRED_ROLES[fmt]
    if fmt == "alpaca" and _is_pairs(columns, found):
        required = ["prompt", "chosen", "rejected"]  # alpaca pairs: chosen/rejected instead of output
    missing = [columns[role] for role in required if columns.get(role) not in found]
    if missing:
        looks = f"; it looks like '{guess}' data" if guess and guess != fmt else ""
        raise DatasetError(
            message=f"format '{fmt}' needs column(s) {', '.join(missing)}; found: "
            f"{', '.join(found) or 'none'}{looks}",
            file=where, key="dataset.columns",
            fix=f"set dataset.format = '{guess}'" if looks else
            "map the roles to your columns in dataset.columns, e.g. "
            + ", ".join(f"{r}='...'" for r in REQUIRED_ROLES[fmt]),
        )
    return fmt, columns


def _is_pairs(columns: dict[str, str], found: list[str]) -> bool:
    return columns.get("chosen", "chosen") in found and columns.get("rejected", "rejected") in found


def _is_labelled(columns: dict[str, str], found: list[str]) -> bool:
    return columns.get("label", "label") in found or ("label" not in columns and "kto_tag" in found)


def _guess_format(found: list[str], columns: dict[str, str]) -> str | None:
    if "messages" in columns:
        return "messages" if columns["messages"] == "messages" else "sharegpt"
    if _is_pairs(columns, found) or _is_labelled(columns, found):
        if "messages" in found:
            return "messages"
        if "conversations" in found:
            return "sharegpt"
        if "instruction" in found or "query" in columns:
            return "alpaca"
        if _is_pairs(columns, found):
            return "preference"
        if columns.get("completion", "completion") in found:
            return "unpaired"
    if "prompt" in columns or "response" in columns:
        return "alpaca"
    if "text" in columns:
        return "text"
    if "messages" in found:
        return "messages"
    if "conversations" in found:
        return "sharegpt"
    if "instruction" in found and "output" in found:
        return "alpaca"
    if "text" in found:
        return "text"
    return None


# ---------------------------------------------------------------- normalising


def normalise_record(row: object, fmt: str, columns: dict) -> dict | None:
    """One record in canonical form, or None when it has no content to train on."""
    if not isinstance(row, dict):
        raise _Problem(f"record is a {type(row).__name__}, not an object with named columns",
                       fix="each record must be a JSON object like {\"text\": ...}")
    if fmt == "text":
        text = _text(row, columns["text"], required=True)
        return {"text": text} if text.strip() else None
    has_images = bool(row.get(columns.get("images") or "", None))
    if fmt == "preference" or (fmt != "unpaired" and _is_pairs(columns, list(row))):
        pair = _pair_record(row, fmt, columns)
        return _with_images(pair, row, pair["prompt"], columns) if pair is not None else None  # images: the prompt's
    if fmt == "unpaired" or (fmt in ("sharegpt", "messages") and columns.get("label") in row):
        _no_images(has_images, columns)
        return _unpaired_record(row, fmt, columns)
    if fmt == "alpaca":
        messages = _alpaca_messages(row, columns)
    else:
        messages = _system(row, columns) + _turns(row, columns["messages"])
    if not any(m["role"] in TRAINED_ROLES and m["content"].strip() for m in messages):
        return None
    return _with_images({"messages": messages, "tools": _tools(row, columns.get("tools"))}, row, messages, columns)


def _with_images(record: dict, row: dict, turns: list[dict], columns: dict) -> dict:
    """The record with the row's `images` list, as many as the `<image>` placeholders in `turns`."""
    if columns.get("images") in row:
        try:
            listed = images.image_list(row[columns["images"]], columns["images"])
            if listed or images.placeholder_count(turns):
                images.check_placeholders(listed, turns, columns["images"])
        except images.ImageProblem as problem:
            raise _Problem(problem.message, fix=problem.fix) from None
        if listed:
            record["images"] = listed
    return record


def _no_images(has_images: bool, columns: dict) -> None:
    if has_images:
        raise _Problem(f"column '{columns['images']}': images in feedback (KTO) records are not "
                       "supported yet", fix="train on image chats with method.kind = 'sft', 'lora' or 'dpo'")


def _attach_images(record: dict, row: Row, where: str, open_it: bool) -> None:
    """The record's image paths made absolute (relative to its data file) and checked: each exists,
    and, when `open_it`, decodes."""
    if "images" not in record:
        return
    data_file = Path(row.file or where)
    base = data_file.parent if data_file.is_file() else Path.cwd()
    try:
        record["images"] = images.resolve_images(record["images"], base)
        for path in record["images"]:
            if open_it:
                images.check_image_file(path)
            elif not Path(path).is_file():
                images.check_image_file(path)  # the missing file's error
    except images.ImageProblem as problem:
        raise _row_error(row, where, _Problem(problem.message, fix=problem.fix)) from None


def normalise_rows(rows: list[Row], spec: DatasetSpec, where: str) -> tuple[list[dict], str, int]:
    """(canonical records, format, number skipped as empty); errors name the file and line."""
    for row in rows[:DETECT_ROWS]:
        if not isinstance(row.data, dict):
            raise _row_error(row, where, _Problem(
                f"record is a {type(row.data).__name__}, not an object with named columns",
                fix="each record must be a JSON object like {\"text\": ...}"))
    fmt, columns = detect_format([r.data for r in rows], spec, where)
    records, opened = [], 0
    for row in rows:
        try:
            record = normalise_record(row.data, fmt, columns)
        except _Problem as problem:
            raise _row_error(row, where, problem) from None
        if record is not None:
            _attach_images(record, row, where, open_it=opened < IMAGE_OPEN_CHECKS)
            opened += "images" in record
            records.append(record)
    return records, fmt, len(rows) - len(records)


def _row_error(row: Row, where: str, problem: _Problem) -> DatasetError:
    at = "" if row.line else f"the record at byte offset {row.offset}: " if row.offset is not None \
        else f"record {row.index}: "
    key = "dataset.columns" if problem.key else None  # the message names the column itself
    return DatasetError(message=at + problem.message, file=row.file or where, line=row.line,
                        key=key, fix=problem.fix)


def _text(row: dict, column: str | None, required: bool = False) -> str:
    if column is None or column not in row:
        if required:
            raise _Problem(f"column '{column}' is missing; found: {', '.join(row)}", key=column,
                           fix="add it to every record, or map it in dataset.columns")
        return ""
    value = row[column]
    if value is None:
        return ""
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return str(value)
    raise _Problem(f"column '{column}' holds a {type(value).__name__}, expected text", key=column,
                   fix="check dataset.format and dataset.columns")


def _parsed(value: object) -> object:
    """A list stored as a JSON string (CSV cells) becomes the list."""
    if isinstance(value, str) and value.strip()[:1] in ("[", "{"):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def _alpaca_messages(row: dict, columns: dict) -> list[dict]:
    response = _text(row, columns["response"], required=True)
    return _alpaca_prompt(row, columns) + [{"role": "assistant", "content": response}]


def _alpaca_prompt(row: dict, columns: dict) -> list[dict]:
    """System, history and the user turn of an alpaca record (everything but the answer)."""
    prompt = _text(row, columns["prompt"], required=True)
    query = _text(row, columns.get("query"))
    messages = _system(row, columns)
    history = _parsed(row.get(columns.get("history") or "", None)) or []
    if not isinstance(history, list) or not all(
        isinstance(t, (list, tuple)) and len(t) == 2 for t in history
    ):
        raise _Problem(f"column '{columns['history']}' must be a list of [prompt, response] pairs",
                       key=columns["history"], fix="e.g. [[\"hi\", \"hello\"]], or leave it empty")
    for user, assistant in history:
        messages += [{"role": "user", "content": str(user)}, {"role": "assistant", "content": str(assistant)}]
    user = f"{prompt}\n{query}" if query.strip() else prompt
    return messages + [{"role": "user", "content": user}]


# ---------------------------------------------------------------- preference records


def _pair_record(row: dict, fmt: str, columns: dict) -> dict | None:
    """{"prompt", "chosen", "rejected", "tools"}; None when an answer is empty."""
    chosen = _answer(row, columns["chosen"])
    rejected = _answer(row, columns["rejected"])
    if fmt == "alpaca":
        prompt = _alpaca_prompt(row, columns)
    elif fmt == "preference":
        prompt = _answer(row, columns["prompt"], role="user") if columns["prompt"] in row else []
        if not prompt:  # implicit prompt: chosen and rejected are whole chats sharing their start
            shared = 0
            while shared < min(len(chosen), len(rejected)) - 1 and chosen[shared] == rejected[shared]:
                shared += 1
            prompt, chosen, rejected = chosen[:shared], chosen[shared:], rejected[shared:]
        prompt = _system(row, columns) + prompt
    else:
        prompt = _system(row, columns) + _turns(row, columns["messages"])
    _check_prompt(prompt, columns)
    if not (_trains(chosen) and _trains(rejected)):
        return None
    return {"prompt": prompt, "chosen": chosen, "rejected": rejected, "tools": _tools(row, columns.get("tools"))}


def _unpaired_record(row: dict, fmt: str, columns: dict) -> dict | None:
    """{"prompt", "completion", "label", "tools"}: the label judges the trailing assistant turns."""
    label = _label(row, columns["label"])
    if fmt == "unpaired":
        prompt = _system(row, columns) + _answer(row, columns["prompt"], role="user")
        completion = _answer(row, columns["completion"])
    else:
        turns = _system(row, columns) + _turns(row, columns["messages"])
        split = len(turns)
        while split > 0 and turns[split - 1]["role"] in TRAINED_ROLES:
            split -= 1
        prompt, completion = turns[:split], turns[split:]
        if not completion:
            raise _Problem(f"column '{columns['messages']}' must end with the assistant answer that "
                           f"'{columns['label']}' judges", key=columns["messages"],
                           fix="put the judged answer last, as an assistant turn")
    _check_prompt(prompt, columns)
    if not _trains(completion):
        return None
    return {"prompt": prompt, "completion": completion, "label": label,
            "tools": _tools(row, columns.get("tools"))}


def _answer(row: dict, column: str, role: str = "assistant") -> list[dict]:
    """An answer (or a prompt) as turns: text, one {role, content}/{from, value} turn, or a list."""
    if column not in row:
        raise _Problem(f"column '{column}' is missing; found: {', '.join(row)}", key=column,
                       fix="add it to every record, or map it in dataset.columns")
    value = _parsed(row[column])
    if value is None or isinstance(value, (str, int, float)) and not isinstance(value, bool):
        text = "" if value is None else str(value)
        return [{"role": role, "content": text}] if text.strip() else []
    if isinstance(value, dict):
        return [_turn(value, column, 0)]
    if isinstance(value, list):
        return [{"role": role, "content": turn} if isinstance(turn, str) else _turn(turn, column, n)
                for n, turn in enumerate(value)]
    raise _Problem(f"column '{column}' holds a {type(value).__name__}, expected text or turns", key=column,
                   fix="use a string, one {\"role\", \"content\"} turn, or a list of turns")


def _check_prompt(prompt: list[dict], columns: dict) -> None:
    if prompt and prompt[-1]["role"] in TRAINED_ROLES:
        where = columns.get("messages") or columns.get("prompt") or "prompt"
        raise _Problem(f"the prompt in '{where}' ends with an assistant turn; the answers to compare "
                       "belong in the chosen/rejected (or completion) columns", key=where,
                       fix="end the prompt with the user's turn")


def _trains(turns: list[dict]) -> bool:
    return any(t["role"] in TRAINED_ROLES and t["content"].strip() for t in turns)


def _label(row: dict, column: str) -> bool:
    value = row.get(column)
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0", "yes", "no"):
        return value.strip().lower() in ("true", "1", "yes")
    raise _Problem(f"column '{column}' must be true or false (is the answer good?), not {value!r}", key=column,
                   fix="write a boolean label in every record")


def record_kind(record: dict) -> str:
    """What a canonical record is: one of RECORD_KINDS."""
    if "text" in record:
        return "text"
    if "chosen" in record:
        return "pairs"
    if "label" in record:
        return "unpaired"
    return "chat"


def _system(row: dict, columns: dict) -> list[dict]:
    system = _text(row, columns.get("system"))
    return [{"role": "system", "content": system}] if system.strip() else []


def _turns(row: dict, column: str) -> list[dict]:
    if column not in row:
        raise _Problem(f"column '{column}' is missing; found: {', '.join(row)}", key=column,
                       fix="add it to every record, or map it in dataset.columns")
    turns = _parsed(row[column])
    if not isinstance(turns, list) or not turns:
        raise _Problem(f"column '{column}' must be a non-empty list of turns", key=column,
                       fix="each turn is {\"role\": ..., \"content\": ...} or {\"from\": ..., \"value\": ...}")
    return [_turn(turn, column, n) for n, turn in enumerate(turns)]


def _turn(turn: object, column: str, n: int) -> dict:
    if not isinstance(turn, dict):
        raise _Problem(f"turn {n} of '{column}' is a {type(turn).__name__}, not an object", key=column,
                       fix="each turn is {\"role\": ..., \"content\": ...} or {\"from\": ..., \"value\": ...}")
    tag = turn.get("role", turn.get("from"))
    role = ROLES.get(str(tag).lower())
    if role is None:
        hint = did_you_mean(str(tag), ROLES) or f"use one of: {', '.join(ROLES)}"
        raise _Problem(f"turn {n} of '{column}' has unknown role '{tag}'", key=column, fix=hint)
    content = turn.get("content", turn.get("value"))
    if role == "assistant" and not content and turn.get("tool_calls"):
        role, content = "tool_call", json.dumps(turn["tool_calls"], ensure_ascii=False)
    return {"role": role, "content": _content_text(content, column, n)}


def _content_text(content: object, column: str, n: int) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts: keep the text ones
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    if isinstance(content, dict):
        return json.dumps(content, ensure_ascii=False)
    raise _Problem(f"turn {n} of '{column}' has {type(content).__name__} content, expected text",
                   key=column, fix="make each turn's content a string")


def _tools(row: dict, column: str | None) -> str | None:
    value = row.get(column) if column else None
    if value in (None, "", [], {}):
        return None
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


# ---------------------------------------------------------------- API


def load_records(spec: DatasetSpec, base_dir: str | Path | None = None) -> list[dict]:
    """Canonical records of a demo or local dataset, honouring max_samples."""
    source = resolve_source(spec, base_dir)
    records, _, _ = _records(source, spec)
    return records


def inspect_dataset(spec: DatasetSpec, base_dir: str | Path | None = None, limit: int = 5) -> DatasetInfo:
    """Describe a dataset: source, format, size, and its first canonical records. Reads what it
    needs: files over datafiles.WHOLE_BYTES by a bounded sample (format, columns, binary content),
    their records counted from their size."""
    source = resolve_source(spec, base_dir)
    if source.kind == "hub":
        return DatasetInfo(source.describe(), spec.format, None, [], list(spec.columns.values()), is_hub=True)
    rows, total, size, sampled = sample_rows(source)
    records, fmt, skipped = normalise_rows(rows, spec, source.name)
    if not sampled:
        records = limit_records(records, spec, source.name)
        count = len(records)
    else:
        limit_records(records, spec, source.name)  # none at all in the sample: an error
        count = round(total * len(records) / max(len(rows), 1))
        count = min(count, spec.max_samples) if spec.max_samples else count
    columns = sorted({k for r in rows[:DETECT_ROWS] if isinstance(r.data, dict) for k in r.data})
    return DatasetInfo(source.describe(), fmt, count, records[:limit], columns, skipped,
                       kind=record_kind(records[0]), size=size, sampled=sampled,
                       with_images=sum("images" in r for r in records))


def _records(source: Source, spec: DatasetSpec):
    rows = read_rows(source)
    records, fmt, skipped = normalise_rows(rows, spec, source.name)
    return limit_records(records, spec, source.name), fmt, skipped


def iter_records(spec: DatasetSpec, base_dir: str | Path | None = None) -> Iterator[dict]:
    """The canonical records of load_records, one at a time: JSON lines and text files are read
    line by line (memory does not grow with the file); other files whole. The format is decided
    from the first DETECT_ROWS rows; errors name the file and line as load_records' do."""
    source = resolve_source(spec, base_dir)
    if source.kind not in ("file", "folder"):
        yield from load_records(spec, base_dir)
        return
    rows = _stream_rows(source)
    head = list(itertools.islice(rows, DETECT_ROWS))
    for row in head:
        if not isinstance(row.data, dict):
            raise _row_error(row, source.name, _Problem(
                f"record is a {type(row.data).__name__}, not an object with named columns",
                fix="each record must be a JSON object like {\"text\": ...}"))
    fmt, columns = detect_format([r.data for r in head], spec, source.name)
    count = 0
    for row in itertools.chain(head, rows):
        try:
            record = normalise_record(row.data, fmt, columns)
        except _Problem as problem:
            raise _row_error(row, source.name, problem) from None
        if record is None:
            continue
        _attach_images(record, row, source.name, open_it=False)
        yield record
        count += 1
        if spec.max_samples and count >= spec.max_samples:
            return
    if not count:
        limit_records([], spec, source.name)  # the error: no records left


def _stream_rows(source: Source) -> Iterator[Row]:
    for path in source.files:
        if path.suffix.lower() not in (".jsonl", ".txt"):
            yield from _read_file(path)
            continue
        found = False
        with path.open("rb") as handle:
            for number, raw in enumerate(handle, start=1):
                line = datafiles.check_text(raw, path, handle.tell() - len(raw), number) if raw.strip() else ""
                if number == 1:
                    line = line.lstrip("\ufeff")
                if not line.strip():
                    continue
                if path.suffix.lower() == ".txt":
                    row = Row({"text": line.rstrip("\r\n")}, str(path), number, 0)
                else:
                    row = datafiles.json_lines(line, path, number, 0)[0]
                found = True
                yield row
        if not found:
            raise DatasetError(message="file has no records", file=str(path), fix="add records to it")


def limit_records(records: list[dict], spec: DatasetSpec, where: str) -> list[dict]:
    """The first max_samples records; an error when none are left."""
    if spec.max_samples:
        records = records[: spec.max_samples]
    if not records:
        raise DatasetError(message="no records left after dropping empty ones and max_samples",
                           file=where, key="dataset.max_samples",
                           fix="check that records have content (text, or an assistant answer)")
    return records


def eval_fraction(spec: DatasetSpec) -> float:
    """eval_split as a held-out fraction (0 when it names a file)."""
    value = spec.eval_split
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return 0.0
        if not 0.0 <= value <= 0.5:
            raise DatasetError(message=f"eval_split {value} is not between 0 and 0.5",
                               key="dataset.eval_split", fix="use a fraction like 0.05, or a file path")
    return float(value)


def eval_file_spec(spec: DatasetSpec) -> DatasetSpec | None:
    """The spec of the eval file named by eval_split (same format and columns), or None."""
    value = spec.eval_split
    if not isinstance(value, str) or not value.strip():
        return None
    try:
        float(value)
        return None
    except ValueError:
        return spec.model_copy(update={"name": value.strip(), "eval_split": 0.0})
