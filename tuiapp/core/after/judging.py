"""`llmtui eval RUN --judge ENDPOINT_OR_RUN`: an LLM as the judge of a run's answers.

The run answers a prompt set (the demo facts' held-out questions, or a file of the user's) through
the inference server (tuiapp.trainer.tools.serve, as `llmtui chat` does); so does its opponent (its base,
or another run's final model) for a pairwise judgement. Each pair, or each answer alone, goes to a
judge with a rubric: any OpenAI-compatible endpoint (`http://host:port/v1`), or a run served by
`llmtui serve`. Pairwise: win / loss / tie per prompt (the two answers swap places on every other
prompt, against position bias), win rate with a Wilson 95% interval; single: a 1-10 rating, its mean
with a bootstrap 95% interval. A verdict that cannot be read is counted as invalid and reported,
never guessed. The result: runs/<id>/judge/<UTC time>.json."""

from __future__ import annotations

import json
import math
import os
import random
import re
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from tuiapp.core.after.chat import ChatSession
from tuiapp.core.after.targets import model_target, require_base
from tuiapp.core.common.errors import RunError, UserError
from tuiapp.core.data.demo_data import facts_eval_pairs
from tuiapp.core.run_folder import stamped
from tuiapp.core.run_folder.rundir import RunDir
from tuiapp.core.store import served
from tuiapp.core.store.runs import RunStore

KEY_ENV = "LLMTUI_JUDGE_API_KEY"  # the judge endpoint's API key (else OPENAI_API_KEY); never recorded
DEMO_PROMPTS = "demo:facts-heldout"
PAIRWISE_RUBRIC = ("You are an impartial judge. Compare two assistant answers to the user's question for "
                   "correctness, helpfulness and concision. Reply with your verdict only: [[A]] if answer A is "
                   "better, [[B]] if answer B is better, [[C]] for a tie.")
SINGLE_RUBRIC = ("You are an impartial judge. Rate the assistant's answer to the user's question for correctness, "
                 "helpfulness and concision on a scale of 1 to 10. Reply with your rating only, as: Rating: [[N]]")
Z95 = 1.959963984540054


# ---------------------------------------------------------------- verdicts


def parse_pairwise(text: str) -> str | None:
    """'A', 'B' or 'tie' from a judge's reply ([[A]], [[B]], [[C]]/[[tie]], or a reply that is just
    the letter or 'tie'); None when it cannot be read (several verdicts, or none)."""
    text = (text or "").strip()
    found = {m.upper() for m in re.findall(r"\[\[\s*(A|B|C|tie)\s*\]\]", text, flags=re.IGNORECASE)}
    if not found:
        bare = re.fullmatch(r"[\s\"'*(]*(?:verdict\s*:\s*)?(A|B|C|tie)[\s\"'*).!]*", text, flags=re.IGNORECASE)
        found = {bare.group(1).upper()} if bare else set()
    if len(found) != 1:
        return None
    verdict = found.pop()
    return "tie" if verdict in ("C", "TIE") else verdict


def parse_rating(text: str) -> float | None:
    """The 1-10 rating of a reply ('Rating: [[7]]', '[[7]]', or a reply that is just the number)."""
    text = (text or "").strip()
    found = re.findall(r"\[\[\s*(\d+(?:\.\d+)?)\s*\]\]", text) or re.findall(
        r"^(?:rating\s*:\s*)?(\d+(?:\.\d+)?)\s*(?:/\s*10)?\.?$", text, flags=re.IGNORECASE)
    values = {float(v) for v in found}
    if len(values) != 1:
        return None
    value = values.pop()
    return value if 1 <= value <= 10 else None


def outcome_of(verdict: str | None, swapped: bool) -> str | None:
    """The run's win, loss or tie from a pairwise verdict ('A', 'B', 'tie'); the run is B when swapped."""
    if verdict is None or verdict == "tie":
        return verdict
    return "win" if (verdict == "A") != swapped else "loss"


def wilson(successes: float, n: int, z: float = Z95) -> tuple[float, float] | None:
    """Wilson score interval of a proportion (None without trials)."""
    if n <= 0:
        return None
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def bootstrap_mean(values: list[float], rounds: int = 2000, seed: int = 0) -> tuple[float, float] | None:
    """A 95% percentile bootstrap interval of the mean (fixed seed: the same ratings, the same interval)."""
    if not values:
        return None
    rng = random.Random(seed)
    means = sorted(sum(rng.choices(values, k=len(values))) / len(values) for _ in range(rounds))
    return means[int(0.025 * (rounds - 1))], means[int(0.975 * (rounds - 1))]


def pairwise_summary(outcomes: list[str | None]) -> dict:
    """Counts (win, loss, tie, invalid: from the run's side), the win rate over valid verdicts with
    its Wilson interval, and the score counting a tie as half a win."""
    wins, losses, ties = (outcomes.count(k) for k in ("win", "loss", "tie"))
    valid = wins + losses + ties
    interval = wilson(wins, valid)
    return {"n": len(outcomes), "valid": valid, "win": wins, "loss": losses, "tie": ties,
            "invalid": len(outcomes) - valid, "win_rate": wins / valid if valid else None,
            "win_rate_ci95": list(interval) if interval else None,
            "score": (wins + ties / 2) / valid if valid else None,
            "score_ci95": list(wilson(wins + ties / 2, valid)) if valid else None}


def single_summary(ratings: list[float | None]) -> dict:
    valid = [r for r in ratings if r is not None]
    interval = bootstrap_mean(valid)
    return {"n": len(ratings), "valid": len(valid), "invalid": len(ratings) - len(valid),
            "mean": sum(valid) / len(valid) if valid else None, "mean_ci95": list(interval) if interval else None}


# ---------------------------------------------------------------- the judge


@dataclass
class Judge:
    url: str  # an OpenAI-compatible base URL, ending in /v1
    model: str  # the model the requests name
    label: str  # what the result says judged: the URL, or the served run
    max_tokens: int = 32
    timeout_s: float = 120.0

    def ask(self, system: str, user: str) -> str:
        body = {"model": self.model, "temperature": 0, "max_tokens": self.max_tokens,
                "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]}
        request = urllib.request.Request(self.url.rstrip("/") + "/chat/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json", **_auth()}, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as answer:
                data = json.loads(answer.read().decode("utf-8"))
        except urllib.error.HTTPError as exc:
            raise RunError(message=f"the judge at {self.url} answered {exc.code}: {exc.read()[:300]!r}",
                           fix="check the judge endpoint, its model name (--judge-model) and API key "
                           f"(${KEY_ENV})") from None
        except (OSError, ValueError) as exc:
            raise RunError(message=f"the judge at {self.url} did not answer: {exc}",
                           fix="check that it is up (llmtui serve RUN --status)") from None
        try:
            return str(data["choices"][0]["message"]["content"] or "")
        except (KeyError, IndexError, TypeError):
            return ""


def _auth() -> dict:
    key = os.environ.get(KEY_ENV) or os.environ.get("OPENAI_API_KEY") or os.environ.get(served.TOKEN_ENV)
    return {"Authorization": f"Bearer {key}"} if key else {}


def _models_of(url: str) -> list[str]:
    try:
        request = urllib.request.Request(url.rstrip("/") + "/models", headers=_auth())
        with urllib.request.urlopen(request, timeout=10) as answer:
            data = json.loads(answer.read().decode("utf-8"))
        return [str(m.get("id")) for m in data.get("data") or [] if isinstance(m, dict) and m.get("id")]
    except (OSError, ValueError, AttributeError):
        return []


def resolve_judge(spec: str, store: RunStore, model: str | None = None) -> Judge:
    """An endpoint URL, or a run served by `llmtui serve` (its URL and model from serve.json)."""
    spec = spec.strip()
    if re.match(r"^https?://", spec):
        url = spec.rstrip("/")
        url = url if url.endswith("/v1") else url + "/v1"
        names = [model] if model else _models_of(url)
        if not names:
            raise UserError(message=f"the judge endpoint {url} lists no model", key="--judge",
                            fix="name it with --judge-model NAME, or check that the endpoint is up")
        return Judge(url, names[0], spec)
    run = store.get(spec)  # a run id or name; UserError when there is none
    record = served.read_record(run.path)
    if served.state(record) != served.SERVING:
        raise UserError(message=f"{run.id} is not served ({served.state(record)})", key="--judge",
                        fix=f"serve it first: llmtui serve {run.id} (then wait for `llmtui serve {run.id} --status` "
                        "to say serving), or pass an endpoint URL")
    url = served.url_of(record)
    names = [model] if model else _models_of(url) or [run.id]
    return Judge(url, names[0], f"{run.id} (served at {url})")


# ---------------------------------------------------------------- prompts and the plan


def read_prompts(spec: str, limit: int, base_dir: Path | None = None) -> list[dict]:
    """[{prompt, reference?}] of the demo facts' held-out questions, or of a file: .txt one prompt a
    line, .jsonl with a prompt / question / instruction field (and an optional reference / answer)."""
    if spec == DEMO_PROMPTS:
        items = [{"prompt": q, "reference": a} for q, a in facts_eval_pairs()]
        random.Random(0).shuffle(items)
    else:
        path = Path(spec).expanduser()
        path = path if path.is_absolute() else (Path(base_dir) if base_dir else Path.cwd()) / path
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            raise UserError(message=f"prompt file not found: {path}", key="--prompts",
                            fix=f"a .txt (one prompt a line) or .jsonl file, or {DEMO_PROMPTS}") from None
        items = []
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            if path.suffix.lower() != ".jsonl":
                items.append({"prompt": line.strip()})
                continue
            try:
                row = json.loads(line)
                prompt = next(str(row[k]) for k in ("prompt", "question", "instruction") if row.get(k))
            except (ValueError, StopIteration, TypeError, AttributeError):
                raise UserError(message="not a JSON line with a prompt, question or instruction", file=str(path),
                                line=number, key="--prompts", fix='one {"prompt": "..."} per line') from None
            reference = next((str(row[k]) for k in ("reference", "answer", "output") if row.get(k)), None)
            items.append({"prompt": prompt, **({"reference": reference} if reference else {})})
    if not items:
        raise UserError(message="no prompts to judge", key="--prompts", fix="give a file with prompts")
    return items[:limit] if limit else items


@dataclass
class JudgeRequest:
    judge: str
    judge_model: str | None = None
    mode: str = "pairwise"  # pairwise | single
    against: str = "base"  # base | a run (pairwise)
    prompts: str = DEMO_PROMPTS
    limit: int = 20
    rubric: str = ""
    max_new_tokens: int = 64


@dataclass
class JudgePlan:
    run_dir: Path
    judge: Judge
    mode: str
    prompts: list[dict]
    rubric: str
    against: str  # base, or the other run's id
    against_dir: Path | None  # the other run's folder (None: the base)
    max_new_tokens: int
    out: Path
    answers: dict = field(default_factory=dict)

    @property
    def summary(self) -> str:
        versus = f" against {self.against}" if self.mode == "pairwise" else " (single-answer ratings)"
        return f"judging {len(self.prompts)} answers of {self.run_dir.name}{versus} with {self.judge.label}..."


def plan(run_dir: Path, request: JudgeRequest, store: RunStore, base_dir: Path | None = None) -> JudgePlan:
    if request.mode not in ("pairwise", "single"):
        raise UserError(message=f"unknown judge mode '{request.mode}'", key="--judge-mode", fix="pairwise or single")
    if request.limit < 0:
        raise UserError(message="--limit counts prompts", fix="0 (all) or more")
    target = model_target(run_dir, None, purpose="be judged")
    against_dir = None
    against = request.against.strip() or "base"
    if request.mode == "pairwise":
        if against == "base":
            require_base(Path(run_dir).name, target.base, "its answers are judged against", ", or --against RUN")
        else:
            other = store.get(against)
            model_target(other.path, None, purpose="be judged")
            against_dir, against = other.path, other.id
    prompts = read_prompts(request.prompts, request.limit, base_dir)
    judge = resolve_judge(request.judge, store, request.judge_model)
    rubric = request.rubric or (PAIRWISE_RUBRIC if request.mode == "pairwise" else SINGLE_RUBRIC)
    out = stamped.new_path(RunDir(run_dir).judge)
    return JudgePlan(Path(run_dir), judge, request.mode, prompts, rubric, against, against_dir,
                     request.max_new_tokens, out)


# ---------------------------------------------------------------- running


def _answers(session_of: Callable, run_dir: Path, models: list[str], prompts: list[dict], max_new_tokens: int,
             say: Callable[[str], None]) -> dict[str, list[str]]:
    """Each model's greedy answer to each prompt, from one inference server of the run."""
    session = session_of(run_dir, models)
    out: dict[str, list[str]] = {m: [] for m in models}
    try:
        session.single_turn = True
        session.overrides = {"temperature": 0.0, "max_new_tokens": max_new_tokens}
        session.start()
        for model in models:
            say(f"{model} of {run_dir.name}: answering {len(prompts)} prompts")
            for item in prompts:
                done = session.ask(item["prompt"], model)
                if done.get("event") != "done":
                    raise RunError(message=f"the {model} model of {run_dir.name} failed to answer: "
                                   f"{done.get('message')}", fix=f"see {session.log_path}")
                out[model].append(str(done.get("text") or ""))
    finally:
        session.close()
    return out


def _chat_session(run_dir: Path, models: list[str]) -> ChatSession:
    return ChatSession(run_dir, None, load=models)


def pair_text(prompt: str, first: str, second: str, reference: str | None = None) -> str:
    ref = f"\n\n[Reference answer]\n{reference}" if reference else ""
    return (f"[User question]\n{prompt}{ref}\n\n[The start of assistant A's answer]\n{first}\n[The end of assistant "
            f"A's answer]\n\n[The start of assistant B's answer]\n{second}\n[The end of assistant B's answer]")


def single_text(prompt: str, answer: str, reference: str | None = None) -> str:
    ref = f"\n\n[Reference answer]\n{reference}" if reference else ""
    return f"[User question]\n{prompt}{ref}\n\n[The start of the assistant's answer]\n{answer}\n[The end of the answer]"


def run(planned: JudgePlan, say: Callable[[str], None] = lambda _: None, session_of: Callable = _chat_session) -> dict:
    """Answers, verdicts, the summary; written to planned.out (returned with its `path`)."""
    prompts = planned.prompts
    pairwise = planned.mode == "pairwise"
    own = _answers(session_of, planned.run_dir, ["tuned", *(["base"] if pairwise and planned.against_dir is None
                                                              else [])], prompts, planned.max_new_tokens, say)
    answers = own["tuned"]
    other = own.get("base")
    if pairwise and planned.against_dir is not None:
        other = _answers(session_of, planned.against_dir, ["tuned"], prompts, planned.max_new_tokens, say)["tuned"]
    say(f"asking the judge ({planned.judge.label}) about {len(prompts)} {'pairs' if pairwise else 'answers'}")
    items = []
    for index, item in enumerate(prompts):
        reference = item.get("reference")
        if pairwise:
            swapped = index % 2 == 1  # the run's answer is B on every other prompt
            first, second = (other[index], answers[index]) if swapped else (answers[index], other[index])
            reply = planned.judge.ask(planned.rubric, pair_text(item["prompt"], first, second, reference))
            verdict = parse_pairwise(reply)
            outcome = outcome_of(verdict, swapped)
            items.append({"prompt": item["prompt"], "answer": answers[index], "other": other[index],
                          "run_is": "B" if swapped else "A", "reply": reply, "verdict": verdict, "outcome": outcome})
        else:
            reply = planned.judge.ask(planned.rubric, single_text(item["prompt"], answers[index], reference))
            items.append({"prompt": item["prompt"], "answer": answers[index], "reply": reply,
                          "rating": parse_rating(reply)})
    summary = pairwise_summary([i["outcome"] for i in items]) if pairwise else \
        single_summary([i["rating"] for i in items])
    result = {"time": time.time(), "mode": planned.mode, "judge": planned.judge.label,
              "judge_model": planned.judge.model, "against": planned.against if pairwise else None,
              "rubric": planned.rubric, "prompts": len(prompts), "summary": summary, "items": items}
    stamped.write(planned.out, result)
    return {**result, "path": str(planned.out)}


def judge_pair(run_dir: Path, other: str, prompt: str, answer: str, other_answer: str, judge: Judge) -> dict:
    """The arena's side-by-side sent to the judge: one prompt, the run's answer as A and the other run's
    as B, the pairwise rubric. Recorded as a one-prompt pairwise result in the run's judge/ folder (the
    `source` says it came from the arena); returned with its `path`."""
    reply = judge.ask(PAIRWISE_RUBRIC, pair_text(prompt, answer, other_answer))
    verdict = parse_pairwise(reply)
    outcome = outcome_of(verdict, swapped=False)
    item = {"prompt": prompt, "answer": answer, "other": other_answer, "run_is": "A", "reply": reply,
            "verdict": verdict, "outcome": outcome}
    result = {"time": time.time(), "mode": "pairwise", "source": "arena", "judge": judge.label,
              "judge_model": judge.model, "against": other, "rubric": PAIRWISE_RUBRIC, "prompts": 1,
              "summary": pairwise_summary([outcome]), "items": [item]}
    out = stamped.new_path(RunDir(run_dir).judge)
    stamped.write(out, result)
    return {**result, "path": str(out)}


def results(run_dir: Path) -> list[dict]:
    return [{**data, "path": str(path)} for path, data in
            stamped.listing(RunDir(run_dir).judge, lambda d: isinstance(d.get("summary"), dict))]


def summary_lines(result: dict) -> list[str]:
    """The CLI's (and `llmtui show`'s) lines of a judged result."""
    s = result.get("summary") or {}

    def pct(value) -> str:
        return "-" if value is None else f"{value:.1%}"

    def ci(pair) -> str:
        return f" (95% CI {pct(pair[0])}-{pct(pair[1])})" if pair else ""

    if result.get("mode") == "pairwise":
        out = [f"against {result.get('against')}, judged by {result.get('judge')}:",
               f"  win rate {pct(s.get('win_rate'))}{ci(s.get('win_rate_ci95'))}  "
               f"score (tie = half) {pct(s.get('score'))}{ci(s.get('score_ci95'))}",
               f"  {s.get('win', 0)} won, {s.get('loss', 0)} lost, {s.get('tie', 0)} tied of {s.get('n', 0)}"]
    else:
        mean = s.get("mean")
        interval = s.get("mean_ci95")
        out = [f"rated by {result.get('judge')}:",
               f"  mean rating {'-' if mean is None else f'{mean:.2f}'}/10"
               + (f" (95% CI {interval[0]:.2f}-{interval[1]:.2f})" if interval else "") + f" of {s.get('valid', 0)}"]
    if s.get("invalid"):
        out.append(f"  {s['invalid']} of {s.get('n', 0)} verdicts could not be read (invalid: left out of the rates)")
    return out
