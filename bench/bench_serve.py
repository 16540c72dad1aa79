"""Load test of `llmtui serve`: N concurrent clients (the official openai client, one per thread) ask a
served run's model for short answers; latency p50/p99, completion tokens per second, errors by kind,
the server's RSS before and after, and how long a 7 MB prompt takes to be refused.

    python bench/bench_serve.py RUN [--runs-dir runs] [--clients 50,200] [--requests 1000] [--max-tokens 8]
                                    [--continuous-batching]

RUN is a finished run (id or prefix); the script starts `llmtui serve` on a free port, runs each client
count in turn (`--requests` requests in all per count), and stops the server. --continuous-batching
serves with transformers' continuous batching (`llmtui serve --continuous-batching`). Prints a Markdown table
(pasted into bench/RESULTS.md by hand: bench/run.py does not run this one).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tuiapp.core.store import served  # noqa: E402
from tuiapp.core.store.runs import RunStore  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))] if ordered else float("nan")


def error_kind(exc: BaseException) -> str:
    status = getattr(exc, "status_code", None)
    return f"HTTP {status}" if status else type(exc).__name__


def load(base: str, model: str, clients: int, requests: int, max_tokens: int) -> dict:
    import openai

    latencies: list[float] = []
    tokens: list[int] = []
    errors: Counter = Counter()
    lock = threading.Lock()
    remaining = [requests]
    gate = threading.Barrier(clients)

    def worker() -> None:
        client = openai.OpenAI(base_url=base, api_key="none", max_retries=0, timeout=600)
        gate.wait()
        while True:
            with lock:
                if remaining[0] <= 0:
                    return
                remaining[0] -= 1
            started = time.perf_counter()
            try:
                reply = client.chat.completions.create(
                    model=model, messages=[{"role": "user", "content": "What is the capital of France?"}],
                    max_tokens=max_tokens, temperature=0)
                with lock:
                    latencies.append(time.perf_counter() - started)
                    tokens.append(reply.usage.completion_tokens)
            except Exception as exc:  # noqa: BLE001 - every failure is counted by its kind
                with lock:
                    errors[error_kind(exc)] += 1

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    begun = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - begun
    return {"clients": clients, "requests": requests, "ok": len(latencies), "errors": dict(errors),
            "p50_s": percentile(latencies, 0.50), "p99_s": percentile(latencies, 0.99),
            "tokens_per_s": sum(tokens) / wall if wall else 0.0, "requests_per_s": len(latencies) / wall, "wall_s": wall}


def huge_prompt(base: str, model: str) -> tuple[float, int]:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "word " * 1_400_000}],
                       "max_tokens": 8}).encode()
    request = urllib.request.Request(f"{base}/chat/completions", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=120) as answer:
            status = answer.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    return time.perf_counter() - started, status


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("run")
    parser.add_argument("--runs-dir", default=None)
    parser.add_argument("--clients", default="50,200")
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--continuous-batching", action="store_true")
    args = parser.parse_args()
    run = RunStore(args.runs_dir).get(args.run)
    port = free_port()
    cli = [sys.executable, "-m", "tuiapp.cli", "--runs-dir", str(run.path.parent), "serve", run.id]
    env = {**os.environ, served.TOKEN_ENV: ""}
    batching = ["--continuous-batching"] if args.continuous_batching else []
    subprocess.run([*cli, "--port", str(port), *batching], check=True, env=env, cwd=ROOT, stdout=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}/v1"
    try:
        server = psutil.Process(served.read_record(run.path)["pid"])
        load(base, run.id, 4, 20, args.max_tokens)  # warm up
        rss_before = server.memory_info().rss
        rows = []
        for clients in (int(c) for c in args.clients.split(",")):
            result = load(base, run.id, clients, args.requests, args.max_tokens)
            result["rss_mb"] = server.memory_info().rss / 2**20
            rows.append(result)
        rss_after = server.memory_info().rss
        huge_s, huge_status = huge_prompt(base, run.id)
    finally:
        subprocess.run([*cli, "--stop"], env=env, cwd=ROOT, stdout=subprocess.DEVNULL)
    print(f"server RSS before {rss_before / 2**20:.0f} MB, after {rss_after / 2**20:.0f} MB "
          f"({100 * (rss_after - rss_before) / rss_before:+.1f}%) over {args.requests * len(rows)} requests; "
          f"a 7 MB prompt answered {huge_status} in {huge_s * 1000:.0f} ms; load average {os.getloadavg()[0]:.2f}"
          + ("; continuous batching" if args.continuous_batching else ""))
    print()
    print("| clients | requests | ok | errors | p50 | p99 | tokens/s | requests/s | server RSS |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        errors = ", ".join(f"{k}: {v}" for k, v in sorted(r["errors"].items())) or "0"
        print(f"| {r['clients']} | {r['requests']} | {r['ok']} | {errors} | {r['p50_s']:.2f} s | {r['p99_s']:.2f} s | "
              f"{r['tokens_per_s']:.1f} | {r['requests_per_s']:.1f} | {r['rss_mb']:.0f} MB |")
    print()
    print(json.dumps({"rows": rows, "rss_before": rss_before, "rss_after": rss_after, "huge_prompt_s": huge_s,
                      "huge_prompt_status": huge_status}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
