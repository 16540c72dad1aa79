
from hypothesis import given, settings
from hypothesis import strategies as st

from tuiapp.core.run_folder.metrics import JsonlReader, JsonlWriter, dedupe_steps, summarize, train_rows


def test_writer_and_incremental_reader(tmp_path):
    path = tmp_path / "metrics.jsonl"
    reader = JsonlReader(path)
    assert reader.read_new() == []
    with JsonlWriter(path) as writer:
        writer.write({"step": 1, "loss": 2.0})
        assert [r["step"] for r in reader.read_new()] == [1]
        writer.write({"step": 2, "loss": float("nan")})
        rows = reader.read_new()
    assert rows[0]["loss"] == "nan"
    assert reader.read_new() == []


def test_partial_last_line_is_kept_for_later(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 1}\n{"step": 2, "lo')
    reader = JsonlReader(path)
    assert [r["step"] for r in reader.read_new()] == [1]
    with open(path, "a") as f:
        f.write('ss": 1.5}\n')
    assert reader.read_new() == [{"step": 2, "loss": 1.5}]


def test_malformed_lines_and_truncation(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_bytes(b'{"step": 1}\nnot json\n\xff\xfe\n[1,2]\n{"step": 2}\n')
    reader = JsonlReader(path)
    assert [r["step"] for r in reader.read_new()] == [1, 2]
    assert reader.malformed == 3
    path.write_text('{"step": 9}\n')  # truncated and rewritten
    assert [r["step"] for r in reader.read_new()] == [9]


def test_missing_or_deleted_file(tmp_path):
    path = tmp_path / "gone" / "m.jsonl"
    assert JsonlReader(path).read_new() == []


def test_dedupe_keeps_last_row_per_step_and_summary():
    rows = [{"step": 1, "loss": 3.0}, {"step": 2, "loss": 2.5}, {"step": 2, "loss": 2.4},
            {"split": "eval", "step": 2, "eval_loss": 2.2}]
    assert [r["loss"] for r in dedupe_steps(train_rows(rows))] == [3.0, 2.4]
    summary = summarize(rows)
    assert summary["last_loss"] == 2.4 and summary["best_eval_loss"] == 2.2


def test_summary_flags_nonfinite_loss():
    assert summarize([{"step": 1, "loss": "nan"}])["nonfinite_loss"]
    assert not summarize([{"step": 1, "loss": 1.0}])["nonfinite_loss"]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2000), st.integers(0, 2000))
def test_fuzzed_files_never_raise(tmp_path_factory, data, cut):
    path = tmp_path_factory.mktemp("fuzz") / "m.jsonl"
    path.write_bytes(data[:cut])
    reader = JsonlReader(path)
    rows = reader.read_new()
    path.write_bytes(data)
    rows += reader.read_new()
    assert all(isinstance(r, dict) for r in rows)
    summarize(rows)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.dictionaries(st.sampled_from(["step", "loss", "split", "mem", "time"]),
                                st.one_of(st.integers(), st.floats(), st.text(max_size=5), st.none()))))
def test_summary_of_arbitrary_rows_never_raises(rows):
    summarize(rows)
