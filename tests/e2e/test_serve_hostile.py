"""`llmtui serve` under hostile requests, on a finished tiny run's model started through the real CLI:
a 7 MB prompt is refused by its token count in under a second, an answer that would not fit the
context is refused with the reason, `"stop": 5` and `Content-Length: -1` are 400s, and 120 clients at
once are all answered (200, or 503 when too many wait), none reset."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time

import pytest

from tests.e2e.helpers import free_port, llmtui, post_json
from tuiapp.core.store import served

pytestmark = [pytest.mark.slow, pytest.mark.extended]  # `make test-extended`: over the full tier's budget for now
CLIENTS = 120


def _raw(port: int, head: bytes, body: bytes = b"") -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head + body)
        sock.shutdown(socket.SHUT_WR)
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
    return out


def test_hostile_requests_are_400s_and_many_clients_are_answered(served_run):
    run = served_run
    port = free_port()
    started = llmtui("serve", run.name, "--port", str(port), runs_dir=run.parent, timeout=300)
    assert started.returncode == 0, started.stdout + started.stderr
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    ask = {"model": run.name, "messages": [{"role": "user", "content": "Who are you?"}], "max_tokens": 2,
           "temperature": 0}

    begun = time.monotonic()
    code, body = post_json(url, {**ask, "messages": [{"role": "user", "content": "word " * 1_400_000}]})  # 7 MB
    assert time.monotonic() - begun < 1.0
    assert code == 400 and body["error"]["code"] == "context_length_exceeded", body
    assert "this model reads at most" in body["error"]["message"]

    code, body = post_json(url, {**ask, "max_tokens": 32768})  # fits the schema, not the context
    assert code == 400 and body["error"]["param"] == "max_tokens" and "ask for at most" in body["error"]["message"]
    code, body = post_json(url, {**ask, "messages": [{"role": "user", "content": "hello " * 3000}]})  # by its exact count
    assert code == 400 and body["error"]["code"] == "context_length_exceeded", body

    code, body = post_json(url, {**ask, "stop": 5})
    assert code == 400 and body["error"]["param"] == "stop"

    head = ("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            "Content-Length: -1\r\n\r\n").encode()
    answer = _raw(port, head, json.dumps(ask).encode())
    assert answer.startswith(b"HTTP/1.1 400") and b"bad Content-Length" in answer, answer[:300]
    head = ("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            "Content-Length: 100000\r\n\r\n").encode()
    answer = _raw(port, head, json.dumps(ask).encode())  # the body ends before its announced length
    assert answer.startswith(b"HTTP/1.1 400") and b"received 1" in answer and b"expected 100000" in answer, \
        answer[:300]

    results: list = []
    gate = threading.Barrier(CLIENTS)

    def client() -> None:
        try:
            gate.wait()
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
            connection.request("POST", "/v1/chat/completions", json.dumps(ask), {"Content-Type": "application/json"})
            results.append(connection.getresponse().status)
        except OSError as exc:
            results.append(type(exc).__name__)

    threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert len(results) == CLIENTS and set(results) <= {200, 503}, sorted(map(str, results))
    assert results.count(200) >= 1
    assert served.stop(run)
