"""The OpenAI server's request handling that needs no model: stop strings cut across streamed
pieces, request validation with OpenAI's error shapes, the bearer token."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuiapp.trainer.tools.openai_server import ApiError, Endpoint, StopFilter


def _stream(stops, pieces):
    cut = StopFilter(stops)
    out = [cut.feed(p) for p in pieces]
    return "".join(out) + cut.flush(), cut.hit


def test_stop_strings_cut_even_across_pieces():
    assert _stream(["END"], ["Hello ", "wor", "ld"]) == ("Hello world", False)
    assert _stream(["END"], ["Hello E", "N", "D and more"]) == ("Hello ", True)
    assert _stream(["\n\n", "###"], ["a\n", "b##", "#c"]) == ("a\nb", True)
    cut = StopFilter(["stop"])
    assert cut.feed("go st") == "go " and cut.feed("ay") == "stay"  # held back only while it may be a stop


def test_requests_are_checked_with_openai_error_shapes():
    endpoint = Endpoint(Path("runs/x"), None, "run-1", token="secret-token")
    assert endpoint.authorized("Bearer secret-token") and endpoint.authorized("bearer secret-token")
    assert not endpoint.authorized("Bearer wrong") and not endpoint.authorized(None)
    assert Endpoint(Path("runs/x"), None, "run-1", token=None).authorized(None)
    messages = [{"role": "developer", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "image_url"}]}]
    assert endpoint.check({"model": "run-1", "messages": messages, "stop": "x"}) == (
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}], ["x"])
    for body, status, param in (({"model": "gpt-4o", "messages": messages}, 404, "model"),
                                ({"model": "run-1", "messages": []}, 400, "messages"),
                                ({"model": "run-1", "messages": [{"content": "no role"}]}, 400, "messages"),
                                ({"model": "run-1", "messages": messages, "n": 2}, 400, "n"),
                                ({"model": "run-1", "messages": messages, "stop": [1]}, 400, "stop")):
        with pytest.raises(ApiError) as caught:
            endpoint.check(body)
        assert caught.value.status == status and caught.value.body()["error"]["param"] == param
    assert ApiError(401, "no").body()["error"]["type"] == "authentication_error"


def test_a_stop_that_is_not_text_is_a_400_not_a_500():
    endpoint = Endpoint(Path("runs/x"), None, "run-1", token=None)
    messages = [{"role": "user", "content": "Hi"}]
    for stop in (5, {"a": 1}, ["a"] * 5, [None]):
        with pytest.raises(ApiError) as caught:
            endpoint.check({"model": "run-1", "messages": messages, "stop": stop})
        assert caught.value.status == 400 and caught.value.body()["error"]["param"] == "stop"
    assert endpoint.check({"model": "run-1", "messages": messages, "stop": None})[1] == []


def _guarded(monkeypatch, token=None, loaded=True, **limits):
    from starlette.testclient import TestClient

    from tuiapp.trainer.tools import openai_server

    for name, value in limits.items():
        monkeypatch.setattr(openai_server, name, value)
    seen = []

    async def app(scope, receive, send):  # stands for transformers' app: echoes the body it is handed
        message = await receive()
        seen.append(message["body"])
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": message["body"]})

    endpoint = Endpoint(Path("runs/x"), None, "run-1", token=token)
    endpoint.loaded = object() if loaded else None
    return TestClient(openai_server.Guard(app, endpoint)), seen


def test_the_guard_in_front_of_transformers_app(monkeypatch):
    client, seen = _guarded(monkeypatch, token="secret-token", MAX_BODY=64)
    refused = client.post("/v1/chat/completions", content=b"{}")
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    auth = {"Authorization": "Bearer secret-token"}
    assert client.post("/v1/chat/completions", content=b'{"a": 1}', headers=auth).text == '{"a": 1}'
    bad = client.post("/v1/chat/completions", content=b"{not json", headers=auth)
    assert bad.status_code == 400 and "not JSON" in bad.json()["error"]["message"]
    assert client.post("/v1/chat/completions", content=b"[1]", headers=auth).status_code == 400
    big = client.post("/v1/chat/completions", content=b'{"a": "' + b"x" * 100 + b'"}', headers=auth)
    assert big.status_code == 413
    assert seen == [b'{"a": 1}']  # only the good body reached the app
    assert client.get("/health").status_code == 200  # no token asked


def test_the_guard_answers_503_while_loading_and_when_full(monkeypatch):
    client, _ = _guarded(monkeypatch, loaded=False)
    loading = client.post("/v1/chat/completions", content=b"{}")
    assert loading.status_code == 503 and loading.json()["error"]["code"] == "model_loading"
    client, seen = _guarded(monkeypatch, MAX_WAITING=0)
    busy = client.post("/v1/chat/completions", content=b"{}")
    assert busy.status_code == 503 and busy.json()["error"]["code"] == "server_busy" and seen == []


def test_a_batched_request_may_not_change_the_batch_s_sampling():
    """--continuous-batching: the batch samples with the run's [generate]; a request asking otherwise is a 400."""
    from types import SimpleNamespace

    from tuiapp.core.config.recipe import GenerateSpec

    endpoint = Endpoint(Path("runs/x"), None, "run-1", token=None)
    endpoint.recipe = SimpleNamespace(generate=GenerateSpec(temperature=0.0))
    for same in ({}, {"temperature": 0}, {"temperature": 0.0, "top_p": 0.5}):  # greedy: top_p plays no part
        endpoint.check_batched(same)
    with pytest.raises(ApiError) as caught:
        endpoint.check_batched({"temperature": 0.7})
    assert caught.value.status == 400 and caught.value.param == "temperature"
    assert "without --continuous-batching" in caught.value.message
    endpoint.recipe = SimpleNamespace(generate=GenerateSpec(temperature=0.8, top_p=0.9))
    endpoint.check_batched({"temperature": 0.8, "top_p": 0.9})
    for bad, param in (({"top_p": 1.0}, "top_p"), ({"temperature": 0}, "temperature"), ({"temperature": "hot"},
                                                                                         "temperature")):
        with pytest.raises(ApiError) as caught:
            endpoint.check_batched(bad)
        assert caught.value.param == param


def test_several_runs_share_one_server_by_model_id():
    from tuiapp.trainer.tools.serve_requests import Models

    models = Models([Endpoint(Path("runs/a"), None, "a", token="secret-token"), Endpoint(Path("runs/b"), None, "b",
                                                                                          token="secret-token")])
    assert models.get("b").model_id == "b" and models.ids == ["a", "b"]
    assert models.authorized("Bearer secret-token") and not models.authorized(None)
    with pytest.raises(ApiError) as caught:
        models.get("c")
    assert caught.value.status == 404 and "'a', 'b'" in caught.value.message
    assert [m["id"] for m in models.models()["data"]] == ["a", "b"]
