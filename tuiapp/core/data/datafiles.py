"""Reading data files within a memory bound, for checks and previews.

A file up to WHOLE_BYTES is read whole (every record is checked). A larger one is read by a
bounded sample: its head, its tail and SAMPLE_OFFSETS chunks at reproducible random offsets,
CHUNK_BYTES each, cut at line boundaries. Every chunk is checked for binary content (a NUL byte,
or bytes that are not UTF-8) and parsed by the file's format; the number of records is counted
from the file's size and the sampled records' mean length, never by loading it. A 2 GB file costs
about 640 KB of reads, whatever it holds.
"""

from __future__ import annotations

import csv
import io
import json
import os
import random
from dataclasses import dataclass
from pathlib import Path

from tuiapp.core.common.errors import DatasetError

WHOLE_BYTES = int(os.environ.get("LLMTUI_SAMPLE_WHOLE_BYTES", str(16 * 1024 * 1024)))
CHUNK_BYTES = 64 * 1024
SAMPLE_OFFSETS = 8
SAMPLE_ROWS = 2000  # sampled records kept for the format and column checks
BINARY_FIX = "this is not a text data file (a NUL byte: binary, or a sparse/zero-filled file); " \
    "point dataset.name at the JSON lines / text / CSV / parquet file"


@dataclass
class Row:
    """One raw record and where it came from, for error messages."""

    data: object
    file: str | None
    line: int | None
    index: int
    offset: int | None = None  # byte offset of the record's line, where the line number is not known


@dataclass
class Sample:
    """What a bounded read of one file found."""

    rows: list[Row]
    size: int  # bytes
    records: int  # estimated from the sample unless exact
    exact: bool  # False: the file was sampled, `records` is an estimate


def check_text(raw: bytes, path: Path, offset: int = 0, line: int | None = 1, cut: bool = False) -> str:
    """raw decoded as UTF-8, or a DatasetError naming the file and the line (when `line` is the
    line number at raw[0]) or the byte offset of the first NUL or undecodable byte. `cut`: raw
    may end inside a character."""
    check_binary(raw, path, offset, line)
    try:
        return raw.decode("utf-8-sig" if offset == 0 else "utf-8")
    except UnicodeDecodeError as exc:
        if cut and exc.start >= len(raw) - 3 and exc.reason == "unexpected end of data":
            return raw[: exc.start].decode("utf-8-sig" if offset == 0 else "utf-8")
        raise DatasetError(
            message=f"not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {offset + exc.start})",
            file=str(path), line=_line_at(raw, exc.start, line),
            fix="save the file as UTF-8, e.g. iconv -f latin1 -t utf-8 in > out",
        ) from None


def check_binary(raw: bytes, path: Path, offset: int = 0, line: int | None = 1) -> None:
    """A NUL byte (binary data, or the zeros of a sparse or preallocated file) is refused."""
    nul = raw.find(b"\0")
    if nul >= 0:
        raise DatasetError(message=f"binary content: a NUL byte at offset {offset + nul}", file=str(path),
                           line=_line_at(raw, nul, line), fix=BINARY_FIX)


def _line_at(raw: bytes, index: int, line: int | None) -> int | None:
    return None if line is None else line + raw[:index].count(b"\n")


def sample_file(path: Path) -> Sample:
    """A bounded sample of a file larger than WHOLE_BYTES: head, random offsets and tail."""
    size = path.stat().st_size
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return _sample_parquet(path, size)
    rows: list[Row] = []
    found = sampled_bytes = 0
    document = suffix == ".csv"  # one document: only its head's records parse on their own
    with path.open("rb") as handle:
        for start in _chunk_starts(size):
            raw = _read_at(handle, start, CHUNK_BYTES)
            head = start == 0
            check_binary(raw, path, start, 1 if head else None)
            if not head:  # the first line is probably cut: start after it
                cut = raw.find(b"\n")
                if cut < 0:
                    continue
                start, raw = start + cut + 1, raw[cut + 1:]
            end = raw.rfind(b"\n")
            cut = start + len(raw) < size
            if cut and end >= 0:  # drop the cut last line, unless at end of file
                raw = raw[: end + 1]
            elif cut and not document and suffix != ".json":
                continue  # no line ends in the chunk (lines over CHUNK_BYTES): not a whole record here
            text = check_text(raw, path, start, 1 if head else None, cut=cut)
            if head:
                document = document or (suffix == ".json" and text.lstrip().startswith("["))
            elif document:
                continue  # the rest of a document is checked for binary content only
            parse = csv_head if suffix == ".csv" else json_array_head if document else \
                text_lines if suffix == ".txt" else json_lines
            parsed = parse(text, path, 1 if head else None, start)
            found += len(parsed)
            keep = SAMPLE_ROWS // (SAMPLE_OFFSETS + 2)  # the head's first rows, others spread over the chunk
            rows += parsed[:keep] if head else parsed[:: max(1, len(parsed) // keep)][:keep]
            sampled_bytes += len(raw)
    if not rows:
        raise DatasetError(message="no records in the sampled parts of the file", file=str(path), line=1,
                           fix="check the file: JSON lines hold one JSON object per line, text one document per line")
    estimate = max(found, round(found * size / max(sampled_bytes, 1)))
    return Sample(rows, size, estimate, exact=False)


def _chunk_starts(size: int) -> list[int]:
    """Head, SAMPLE_OFFSETS random offsets (the same for the same size) and tail, in order."""
    last = max(size - CHUNK_BYTES, 0)
    rng = random.Random(size)
    starts = {0, last, *(rng.randrange(CHUNK_BYTES, last) for _ in range(SAMPLE_OFFSETS) if last > CHUNK_BYTES)}
    return sorted(starts)


def _read_at(handle, start: int, n: int) -> bytes:
    handle.seek(start)
    return handle.read(n)


def _sample_parquet(path: Path, size: int) -> Sample:
    try:
        import pyarrow.parquet as pq  # lazily: only parquet needs it
    except ImportError:
        raise DatasetError(message="reading .parquet needs pyarrow", file=str(path),
                           fix="pip install pyarrow") from None
    try:
        parquet = pq.ParquetFile(path)
        total = parquet.metadata.num_rows
        batch = next(parquet.iter_batches(batch_size=64), None)
    except Exception as exc:  # pyarrow raises several types for broken files
        raise DatasetError(message=f"not a readable parquet file: {exc}", file=str(path),
                           fix="re-export the file, or convert it to .jsonl") from None
    records = batch.to_pylist() if batch is not None else []
    return Sample([Row(r, str(path), None, i) for i, r in enumerate(records)], size, total, exact=False)


def text_lines(text: str, path: Path, line: int | None, offset: int) -> list[Row]:
    """Non-empty lines of a .txt file as {"text"} rows."""
    return [Row({"text": body}, str(path), _nth(line, n), 0, _where(offset, line))
            for n, body in enumerate(text.splitlines()) if body.strip()]


def json_lines(text: str, path: Path, line: int | None, offset: int) -> list[Row]:
    """JSON lines; a bad one names its line (or its byte offset in a sampled chunk)."""
    rows = []
    position = offset
    for n, body in enumerate(text.splitlines(keepends=True)):
        if body.strip():
            try:
                rows.append(Row(json.loads(body), str(path), _nth(line, n), 0, _where(position, line)))
            except json.JSONDecodeError as exc:
                where = "" if line is not None else f" (the line at byte offset {position})"
                raise DatasetError(
                    message=f"not valid JSON: {exc.msg} (column {exc.colno}){where}", file=str(path),
                    line=_nth(line, n),
                    fix="fix or remove that line; JSON lines hold one complete JSON object per line",
                ) from None
        position += len(body.encode("utf-8"))
    return rows


def json_array_head(text: str, path: Path, line: int | None, offset: int) -> list[Row]:
    """The complete records at the start of a JSON array cut short (a large .json file's head)."""
    decoder = json.JSONDecoder()
    rows: list[Row] = []
    position = text.index("[") + 1
    while True:
        while position < len(text) and text[position] in " \t\r\n,":
            position += 1
        if position >= len(text) or text[position] == "]":
            return rows
        try:
            record, position = decoder.raw_decode(text, position)
        except json.JSONDecodeError as exc:
            if rows:
                return rows  # the record the chunk cut
            raise DatasetError(message=f"not valid JSON: {exc.msg} (column {exc.colno})", file=str(path),
                               line=exc.lineno, fix="fix the JSON near that line (a missing comma or quote?)") from None
        rows.append(Row(record, str(path), None, len(rows)))


def csv_head(text: str, path: Path, line: int | None, offset: int) -> list[Row]:
    """The header and the complete rows of a CSV file's head (the last row may be cut: dropped)."""
    reader = csv.DictReader(io.StringIO(text))
    rows = [Row(r, str(path), reader.line_num, 0) for r in reader]
    return rows[:-1] if len(rows) > 1 else rows


def _nth(line: int | None, n: int) -> int | None:
    return None if line is None else line + n


def _where(offset: int, line: int | None) -> int | None:
    return offset if line is None else None
