"""JSON over HTTP to an OpenAI-compatible server (`llmtui serve`, vLLM): one request, its answer or
an EndpointError that says what went wrong (the HTTP status and the server's own message, or why
nothing answered). The API key comes from the first set environment variable of `key_envs`."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request


class EndpointError(Exception):
    def __init__(self, url: str, message: str, status: int | None = None):
        super().__init__(message)
        self.url, self.message, self.status = url, message, status


def auth_header(key_envs: tuple[str, ...]) -> dict:
    key = next((os.environ[name] for name in key_envs if os.environ.get(name)), None)
    return {"Authorization": f"Bearer {key}"} if key else {}


def request_json(url: str, body: dict | None = None, key_envs: tuple[str, ...] = (), timeout: float = 10.0) -> dict:
    """GET `url` (no body) or POST the body; the answer's JSON object."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="GET" if body is None else "POST",
                                     headers={"Content-Type": "application/json", **auth_header(key_envs)})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            parsed = json.loads(answer.read().decode("utf-8"))
    except urllib.error.HTTPError as exc:
        said = exc.read()[:400].decode("utf-8", "replace")
        try:
            said = json.loads(said)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            pass
        raise EndpointError(url, f"answered {exc.code}: {said}", exc.code) from None
    except (OSError, ValueError) as exc:
        raise EndpointError(url, f"did not answer: {getattr(exc, 'reason', None) or exc}") from None
    if not isinstance(parsed, dict):
        raise EndpointError(url, "answered something other than a JSON object")
    return parsed
