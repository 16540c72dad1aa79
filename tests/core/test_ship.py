"""The pure parts of shipping a model: the served record's state, the checks before serving, the
server commands, and the parity comparison."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest

from tuiapp.core.after.parity import Answer, ParityReport, compare, lines
from tuiapp.core.common.errors import RunError, UserError
from tuiapp.core.store import served


def test_a_busy_port_is_refused_and_a_free_one_passes():
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(UserError, match=f"cannot listen on localhost:{port}"):
            served.check_free("localhost", port)
    served.check_free("localhost", port)
    with pytest.raises(UserError, match="not a TCP port"):
        served.check_free("localhost", 70000)


def test_beyond_loopback_needs_a_token():
    served.check_token("localhost", None)
    served.check_token("127.0.0.1", None)
    with pytest.raises(UserError, match="no token is set"):
        served.check_token("0.0.0.0", None)
    served.check_token("0.0.0.0", "a-long-token")
    with pytest.raises(UserError, match="too short"):
        served.check_token("localhost", "short")


def test_state_follows_the_process_not_the_record(tmp_path):
    assert served.state({}) == served.NOT_SERVED
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    try:
        import psutil

        record = {"pid": proc.pid, "pgid": proc.pid, "create_time": psutil.Process(proc.pid).create_time(),
                  "host": "localhost", "port": 1}
        served.write_record(tmp_path, record)
        assert served.state(record) == served.LOADING  # alive, and not answering /health yet
        with pytest.raises(RunError, match="already served"):
            served.check_not_served(tmp_path)
        assert served.stop(tmp_path, grace_s=5)
        after = served.read_record(tmp_path)
        assert after["stopped_at"] and served.state(after) == served.STOPPED
    finally:
        proc.kill()
        proc.wait()
    dead = {"pid": proc.pid, "create_time": time.time() - 1000}  # a reused pid is not the server
    assert served.state(dead) == served.EXITED
    served.check_not_served(tmp_path)  # nothing alive: a new server may start


def test_server_commands_keep_the_token_off_the_command_line(tmp_path):
    argv = served.server_argv(tmp_path, 8001, "localhost", "run-1", checkpoint=30, python="py")
    assert argv == ["py", "-m", "tuiapp.trainer.tools.openai_server", str(tmp_path), "--port", "8001", "--host",
                    "localhost", "--model-id", "run-1", "--checkpoint", "30"]
    assert served.vllm_argv("/m", 9, "::1", "r", python="py") == [
        "py", "-m", "vllm.entrypoints.openai.api_server", "--host", "::1", "--port", "9", "--model", "/m",
        "--served-model-name", "r"]
    lora = served.vllm_argv("/base", 9, "localhost", "r", adapter="/run/final", python="py")
    assert lora[-5:] == ["--model", "/base", "--enable-lora", "--lora-modules", "r=/run/final"]
    assert served.url_of({"host": "::1", "port": 9}) == "http://[::1]:9/v1"
    assert not any("token" in a.lower() for a in argv + lora)


def test_vllm_is_refused_with_the_reason_when_it_cannot_run(monkeypatch):
    from tuiapp.cli import serve
    from tuiapp.core.after.targets import Target

    full = Target("r", "/r/final", "final", "full", "sft", "tiny")
    monkeypatch.setenv("LLMTUI_FORCE_CPU", "1")
    assert serve._backend("auto", [full]) == "transformers"
    with pytest.raises(UserError, match="--backend vllm: "):
        serve._backend("vllm", [full])


def test_several_adapters_share_one_server_only_on_one_base(tmp_path):
    """`llmtui serve A B`: the transformers server names each run's folder; vLLM gets each adapter as a
    LoRA module; a full model, llmtui's bottleneck adapter, another base or another adapter type is refused."""
    from tuiapp.core.after.targets import Target, check_shared_base

    argv = served.server_argv([tmp_path / "a", tmp_path / "b"], 8001, "localhost", None, python="py")
    assert argv == ["py", "-m", "tuiapp.trainer.tools.openai_server", str(tmp_path / "a"), str(tmp_path / "b"),
                    "--port", "8001", "--host", "localhost"]
    lora = served.vllm_argv("/base", 9, "localhost", "a", adapters={"a": "/a/final", "b": "/b/final"}, python="py")
    assert lora[-8:] == ["--model", "/base", "--enable-lora", "--max-loras", "2", "--lora-modules", "a=/a/final",
                         "b=/b/final"]

    def adapter(name, base="tiny", peft_type="LORA", kind="peft"):
        folder = tmp_path / name / "final"
        folder.mkdir(parents=True)
        (folder / "adapter_config.json").write_text(json.dumps({"peft_type": peft_type}))
        return Target(str(tmp_path / name), str(folder), "final", kind, "lora", base)

    a, b = adapter("a"), adapter("b")
    check_shared_base([a, b])
    for other, message in ((Target(str(tmp_path / "c"), "/c/final", "final", "full", "sft", "tiny"), "is a full model"),
                           (adapter("d", kind="bottleneck"), "bottleneck adapter"),
                           (adapter("e", base=str(tmp_path)), "one server holds one base model"),
                           (adapter("f", peft_type="IA3"), "adapters of one type"),
                           (a, "named twice")):
        with pytest.raises(UserError, match=message) as caught:
            check_shared_base([a, other])
        assert message == "named twice" or "llmtui serve a --port 8001" in caught.value.fix


def _answer(ids, text=""):
    return Answer(ids, [f"<{i}>" for i in ids], text)


def test_parity_counts_the_common_prefix_and_names_the_first_diverging_token():
    same = compare("p", _answer([1, 2, 3]), _answer([1, 2, 3]))
    assert same.agreement == 1.0 and same.first_divergence is None
    split = compare("p", _answer([1, 2, 3, 4]), _answer([1, 2, 9]))
    assert split.common == 2 and split.longest == 4 and split.agreement == 0.5
    assert split.first_divergence == {"index": 2, "reference": "<3>", "exported": "<9>"}
    shorter = compare("p", _answer([1, 2]), _answer([1, 2, 5]))
    assert shorter.first_divergence == {"index": 2, "reference": None, "exported": "<5>"}
    report = ParityReport("hf", "gguf", [same, split], min_agreement=0.7)
    assert report.agreement == pytest.approx(5 / 7) and report.passed
    assert ParityReport("hf", "gguf", [same, split], min_agreement=0.8).passed is False
    mismatch = compare("p", _answer([1]), _answer([1]), prompt_tokens_match=False)
    assert ParityReport("hf", "gguf", [mismatch]).passed is False  # a broken tokenizer fails whatever the answers
    text = "\n".join(lines(ParityReport("hf", "gguf", [split], min_agreement=0.9)))
    assert "first diverging token #2: '<3>' vs '<9>'" in text and "FAILED" in text
    assert report.as_dict()["prompts"][1]["agreement"] == 0.5
