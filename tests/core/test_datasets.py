import csv
import json
from pathlib import Path

import pytest

from tuiapp.core.common.errors import DatasetError
from tuiapp.core.config.recipe import DatasetSpec
from tuiapp.core.data.datasets import (
    eval_file_spec,
    eval_fraction,
    inspect_dataset,
    is_hub_dataset,
    load_records,
    source_fingerprint,
)

SHARED_DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"

SHAREGPT_RECORD = {
    "system": "You can call tools.",
    "conversations": [
        {"from": "human", "value": "Weather in Oslo?"},
        {"from": "function_call", "value": '{"name": "weather", "arguments": {"city": "Oslo"}}'},
        {"from": "observation", "value": '{"temp": 3}'},
        {"from": "gpt", "value": "It is 3 degrees in Oslo."},
    ],
    "tools": '[{"name": "weather", "description": "Current weather"}]',
}


def write_json(path: Path, records) -> Path:
    path.write_text(json.dumps(records))
    return path


def write_jsonl(path: Path, records) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def load(name, base_dir=None, **spec) -> list[dict]:
    return load_records(DatasetSpec(name=str(name), **spec), base_dir)


def error_of(name, base_dir=None, **spec) -> DatasetError:
    with pytest.raises(DatasetError) as info:
        load(name, base_dir, **spec)
    return info.value


# ---------------------------------------------------------------- formats


def test_alpaca_becomes_system_history_user_assistant(tmp_path):
    record = {"instruction": "Add", "input": "2 and 3", "output": "5", "system": "Be exact.",
              "history": [["Hi", "Hello!"]]}
    records = load(write_json(tmp_path / "a.json", [record]))
    assert records == [{
        "messages": [
            {"role": "system", "content": "Be exact."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "Add\n2 and 3"},
            {"role": "assistant", "content": "5"},
        ],
        "tools": None,
    }]


def test_sharegpt_maps_roles_and_keeps_tools(tmp_path):
    write_jsonl(tmp_path / "s.jsonl", [SHAREGPT_RECORD])
    info = inspect_dataset(DatasetSpec(name="s.jsonl"), base_dir=tmp_path)
    assert info.format == "sharegpt" and info.count == 1
    record = info.examples[0]
    assert [m["role"] for m in record["messages"]] == ["system", "user", "tool_call", "tool", "assistant"]
    assert record["messages"][0]["content"] == "You can call tools."
    assert json.loads(record["tools"])[0]["name"] == "weather"


def test_messages_format_with_openai_tool_calls(tmp_path):
    record = {"messages": [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "weather"}}]},
        {"role": "tool", "content": "sunny"},
        {"role": "assistant", "content": [{"type": "text", "text": "It is sunny."}]},
    ], "tools": [{"name": "weather"}]}
    info = inspect_dataset(DatasetSpec(name=str(write_jsonl(tmp_path / "m.jsonl", [record]))))
    assert info.format == "messages"
    messages = info.examples[0]["messages"]
    assert [m["role"] for m in messages] == ["user", "tool_call", "tool", "assistant"]
    assert "weather" in messages[1]["content"] and messages[3]["content"] == "It is sunny."
    assert info.examples[0]["tools"] == '[{"name": "weather"}]'


def test_text_from_jsonl_and_txt(tmp_path):
    write_jsonl(tmp_path / "t.jsonl", [{"text": "one"}, {"text": "two"}])
    (tmp_path / "t.txt").write_text("first line\n\n  \nsecond line\n")
    assert load("t.jsonl", tmp_path) == [{"text": "one"}, {"text": "two"}]
    info = inspect_dataset(DatasetSpec(name="t.txt"), tmp_path)
    assert info.format == "text" and info.examples == [{"text": "first line"}, {"text": "second line"}]


def test_csv_with_columns_mapping(tmp_path):
    with open(tmp_path / "qa.csv", "w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["question", "answer"])
        writer.writerows([["What is 2+2?", "4"], ["Capital of Peru?", "Lima"]])
    records = load("qa.csv", tmp_path, columns={"prompt": "question", "response": "answer"})
    assert records[1]["messages"] == [{"role": "user", "content": "Capital of Peru?"},
                                      {"role": "assistant", "content": "Lima"}]


def test_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([{"messages": [{"role": "user", "content": "hi"},
                                                         {"role": "assistant", "content": "hey"}]}]),
                   tmp_path / "m.parquet")
    assert load("m.parquet", tmp_path)[0]["messages"][1] == {"role": "assistant", "content": "hey"}


def test_folder_reads_sorted_files_of_the_split(tmp_path):
    write_jsonl(tmp_path / "b.jsonl", [{"text": "b"}])
    write_jsonl(tmp_path / "a.jsonl", [{"text": "a"}])
    assert load(tmp_path) == [{"text": "a"}, {"text": "b"}]
    write_jsonl(tmp_path / "train.jsonl", [{"text": "train"}])
    write_jsonl(tmp_path / "test.jsonl", [{"text": "test"}])
    assert load(tmp_path) == [{"text": "train"}]
    assert load(tmp_path, split="test") == [{"text": "test"}]


def test_columns_override_detection(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"text": "ignored", "body": "used"}])
    assert load(path, columns={"text": "body"}) == [{"text": "used"}]


def test_max_samples_and_empty_records_skipped(tmp_path):
    rows = [{"instruction": "q", "output": ""}] + [{"instruction": f"q{i}", "output": "a"} for i in range(5)]
    path = write_json(tmp_path / "a.json", rows)
    info = inspect_dataset(DatasetSpec(name=str(path)))
    assert info.count == 5 and info.skipped == 1
    assert len(load(path, max_samples=2)) == 2


def test_demo_and_hub_sources(tmp_path):
    info = inspect_dataset(DatasetSpec(name="demo:chat"), limit=2)
    assert info.format == "messages" and info.count == 800 and len(info.examples) == 2
    hub = DatasetSpec(name="tatsu-lab/alpaca")
    assert is_hub_dataset(hub, tmp_path) and not is_hub_dataset(DatasetSpec(name="demo:facts"))
    info = inspect_dataset(hub, tmp_path)
    assert info.is_hub and info.count is None
    with pytest.raises(DatasetError, match="trainer"):
        load_records(hub, tmp_path)


def test_local_folder_shadows_a_hub_like_name(tmp_path):
    (tmp_path / "owner" / "name").mkdir(parents=True)
    write_jsonl(tmp_path / "owner" / "name" / "x.jsonl", [{"text": "local"}])
    assert not is_hub_dataset(DatasetSpec(name="owner/name"), tmp_path)
    assert load("owner/name", tmp_path) == [{"text": "local"}]


def test_fingerprint_changes_with_the_file(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", [{"text": "a"}])
    before = source_fingerprint(DatasetSpec(name=str(path)))
    write_jsonl(path, [{"text": "a"}, {"text": "b"}])
    assert source_fingerprint(DatasetSpec(name=str(path))) != before
    assert source_fingerprint(DatasetSpec(name="demo:facts"))["version"]


def test_eval_split_fraction_or_file():
    assert eval_fraction(DatasetSpec(eval_split=0.1)) == 0.1
    assert eval_fraction(DatasetSpec(eval_split="0.2")) == 0.2
    assert eval_file_spec(DatasetSpec(eval_split=0.1)) is None
    spec = eval_file_spec(DatasetSpec(name="train.jsonl", eval_split="dev.jsonl", format="alpaca"))
    assert spec.name == "dev.jsonl" and spec.format == "alpaca" and spec.eval_split == 0.0
    assert eval_fraction(DatasetSpec(eval_split="dev.jsonl")) == 0.0


# ---------------------------------------------------------------- errors


def assert_helpful(error: DatasetError, file: Path | str, *words: str):
    text = str(error)
    assert str(file) in text and "fix:" in text, text
    for word in words:
        assert word in text, text


def test_missing_file(tmp_path):
    assert_helpful(error_of("nope.jsonl", tmp_path), tmp_path / "nope.jsonl", "not found", str(tmp_path))


def test_wrong_columns_lists_found_and_expected(tmp_path):
    path = write_json(tmp_path / "a.json", [{"question": "q", "answer": "a"}])
    assert_helpful(error_of(path), path, "question", "answer", "instruction", "conversations")
    error = error_of(path, format="alpaca")
    assert_helpful(error, path, "instruction", "output", "found: answer, question")


def test_format_mismatch_names_the_likely_format(tmp_path):
    path = write_json(tmp_path / "a.json", [{"instruction": "q", "output": "a"}])
    assert_helpful(error_of(path, format="text"), path, "'text' needs column(s) text", "format = 'alpaca'")


def test_malformed_json_line_names_the_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "ok"}\n\n{"text": "broken"\n{"text": "ok"}\n')
    error = error_of(path)
    assert error.line == 3
    assert_helpful(error, f"{path}:3", "not valid JSON")


def test_malformed_json_array_names_the_line(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('[\n  {"text": "a"},\n  {"text": "b"\n  {"text": "c"}\n]\n')
    error = error_of(path)
    assert error.line == 4 and "not valid JSON" in str(error)


def test_record_level_problem_names_the_line(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", [{"instruction": "q", "output": "a"}, {"instruction": "q"}])
    error = error_of(path)
    assert error.line == 2
    assert_helpful(error, f"{path}:2", "'output' is missing")


def test_unknown_role_and_non_object_records(tmp_path):
    bad_role = {"conversations": [{"from": "humam", "value": "hi"}, {"from": "gpt", "value": "yo"}]}
    path = write_json(tmp_path / "s.json", [bad_role])
    assert_helpful(error_of(path), path, "record 0", "humam", "human")
    path = write_json(tmp_path / "l.json", ["just a string"])
    assert_helpful(error_of(path), path, "not an object")


@pytest.mark.parametrize("content", [b"", b"  \n\n"])
def test_empty_file(tmp_path, content):
    path = tmp_path / "empty.jsonl"
    path.write_bytes(content)
    assert_helpful(error_of(path), path, "empty")


def test_non_utf8(tmp_path):
    path = tmp_path / "latin.jsonl"
    path.write_bytes('{"text": "ok"}\n{"text": "caf\xe9"}\n'.encode("latin-1"))
    error = error_of(path)
    assert error.line == 2
    assert_helpful(error, path, "UTF-8")


def test_nothing_left_after_filtering(tmp_path):
    path = write_json(tmp_path / "a.json", [{"instruction": "q", "output": ""}])
    assert_helpful(error_of(path), path, "no records left")


def test_unsupported_suffix_and_unknown_demo(tmp_path):
    (tmp_path / "data.xml").write_text("<x/>")
    assert_helpful(error_of("data.xml", tmp_path), tmp_path / "data.xml", ".jsonl")
    assert "demo:text" in str(error_of("demo:txt"))


# ---------------------------------------------------------------- real samples


@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="../shared/data is absent")
@pytest.mark.parametrize("name, fmt, count", [
    ("alpaca_en_demo.json", "alpaca", 999),
    ("alpaca_zh_demo.json", "alpaca", 1000),
    ("glaive_toolcall_en_demo.json", "sharegpt", 300),
    ("c4_demo.jsonl", "text", 300),
    ("wiki_demo.txt", "text", 30),
])
def test_real_samples_are_detected(name, fmt, count):
    info = inspect_dataset(DatasetSpec(name=name), base_dir=SHARED_DATA)
    assert (info.format, info.count) == (fmt, count)
    if name.startswith("glaive"):
        roles = {m["role"] for r in load(name, SHARED_DATA) for m in r["messages"]}
        assert roles == {"user", "assistant", "tool_call", "tool"}
        assert info.examples[0]["tools"]
