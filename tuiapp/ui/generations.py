"""The run view's Generations pane as data (no Textual): the generations of an online RL run's
latest steps, kept bounded, the step shown (the newest while following), and the lines drawn."""

from __future__ import annotations

import textwrap
from dataclasses import replace

from rich.text import Text

from tuiapp.core.run_folder.completions import Generation

MAX_STEPS = 64  # steps kept; older ones are dropped as new ones come
MAX_PER_STEP = 64  # generations kept of one step
MAX_TEXT = 4000  # characters kept of a prompt or a completion
COMPLETION_LINES = 3  # lines a completion takes at most

StepKey = tuple[int, str]  # (step, split): an evaluation's generations come after its step's own


def _order(key: StepKey) -> tuple[int, bool]:
    return key[0], key[1] == "eval"


class GenerationBrowser:
    """The kept steps and which one is shown: the newest (following) until the user picks another."""

    def __init__(self, max_steps: int = MAX_STEPS, max_per_step: int = MAX_PER_STEP) -> None:
        self.max_steps = max_steps
        self.max_per_step = max_per_step
        self.steps: dict[StepKey, list[Generation]] = {}
        self.picked: StepKey | None = None  # None: follow the newest step
        self.dropped = 0  # older steps no longer kept

    def clear(self) -> None:
        self.steps.clear()
        self.picked = None
        self.dropped = 0

    def add(self, generations: list[Generation]) -> None:
        for generation in generations:
            kept = self.steps.setdefault((generation.step, generation.split), [])
            if len(kept) < self.max_per_step:
                kept.append(replace(generation, prompt=generation.prompt[:MAX_TEXT],
                                    completion=generation.completion[:MAX_TEXT]))
        extra = len(self.steps) - self.max_steps
        if extra > 0:
            for key in self.keys[:extra]:
                del self.steps[key]
            self.dropped += extra
            if self.picked is not None and self.picked not in self.steps:
                self.picked = self.keys[0]

    @property
    def keys(self) -> list[StepKey]:
        return sorted(self.steps, key=_order)

    @property
    def following(self) -> bool:
        return self.picked is None

    @property
    def current(self) -> StepKey | None:
        if self.picked is not None and self.picked in self.steps:
            return self.picked
        keys = self.keys
        return keys[-1] if keys else None

    def move(self, delta: int) -> bool:
        """Show the previous (-1) or next (+1) step; reaching the newest follows it again. False
        when there is no step that way."""
        keys, current = self.keys, self.current
        if current is None:
            return False
        index = keys.index(current) + delta
        if not 0 <= index < len(keys):
            return False
        self.picked = None if index == len(keys) - 1 else keys[index]
        return True


def _score(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _mean(values: list[float | None]) -> float | None:
    numbers = [v for v in values if v is not None]
    return sum(numbers) / len(numbers) if numbers else None


def _one_line(text: str) -> str:
    return " ".join(text.split())


def completion_lines(text: str, width: int, count: int = COMPLETION_LINES) -> list[str]:
    """The completion wrapped to `width`, at most `count` lines, the last ending in … if cut."""
    lines: list[str] = []
    for paragraph in text.strip().splitlines() or [""]:
        lines += textwrap.wrap(paragraph, max(8, width), break_long_words=True, replace_whitespace=False) or [""]
    if len(lines) > count:
        lines = lines[:count]
        lines[-1] = lines[-1][: max(1, width - 1)] + "…"
    return lines


TURN_MARKS = {"model": ("model ", "bold"), "tool_call": ("call  ", "bold cyan"), "tool": ("tool  ", "dim")}


def turn_lines(turns: tuple[tuple[str, str], ...], width: int) -> list[Text]:
    """A rollout's turns: the model's text, each tool call, each result it read (two lines each at most)."""
    out = []
    for role, text in turns:
        mark, style = TURN_MARKS.get(role, (role[:5].ljust(6), "dim"))
        wrapped = completion_lines(text, width - 10, 2) if text.strip() else ["(empty)"]
        out.append(Text.assemble("    ", (mark, style), wrapped[0]))
        out += [Text("          " + line) for line in wrapped[1:]]
    return out


def generation_lines(browser: GenerationBrowser, width: int) -> list[Text]:
    """What the pane shows: the step and where it lies, the mean of each score, then each prompt
    (one line) and its completions, each under its scores."""
    key = browser.current
    if key is None:
        note = ("no generations logged yet: each completion and its rewards appear here once a step is "
                "scored (method.log_completions = false writes none)")
        return [Text(line, style="dim") for line in textwrap.wrap(note, max(20, width - 1))]  # whole at 80 columns
    generations = browser.steps[key]
    keys = browser.keys
    where = f"{keys.index(key) + 1}/{len(keys)} kept" + (f" ({browser.dropped} older dropped)" if browser.dropped else "")
    head = Text.assemble(("step ", "bold"), (f"{key[0]}" + (" eval" if key[1] == "eval" else ""), "bold reverse"),
                         f" · {where} · {len(generations)} generations · ",
                         ("following" if browser.following else "[ ] step · ] on the last follows", "dim"))
    names = list(dict.fromkeys(name for g in generations for name in g.rewards))
    means = [("mean ", "dim"), ("total ", "bold"), (_score(_mean([g.reward for g in generations])), "bold")]
    for name in names:
        means += [f" · {name} ", _score(_mean([g.rewards.get(name) for g in generations]))]
    lines = [head, Text.assemble(*means)]
    prompt = None
    for generation in generations:
        if generation.prompt != prompt:
            prompt = generation.prompt
            lines.append(Text.assemble(("▸ ", "bold"), (_one_line(prompt) or "(empty prompt)", "bold")))
        scores = [("  total ", "dim"), (_score(generation.reward), "bold")]
        scores += [piece for name in names for piece in ((f" · {name} ", "dim"), _score(generation.rewards.get(name)))]
        if generation.advantage is not None:
            scores += [(" · adv ", "dim"), f"{generation.advantage:+.2f}"]
        if generation.tokens is not None:
            scores.append((f" · {generation.tokens} tok" + (" clipped" if generation.clipped else ""), "dim"))
        lines.append(Text.assemble(*scores))
        text = generation.completion
        if generation.turns:  # a multi-turn rollout: each turn on its own lines
            lines += turn_lines(generation.turns, width)
        else:
            lines += [Text("    " + line) for line in completion_lines(text, width - 4)] if text.strip() else \
                [Text("    (empty)", style="dim")]
    for line in lines:
        line.truncate(width, overflow="ellipsis")  # one line each: the pane never wraps them
    return lines
