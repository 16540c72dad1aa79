"""Parity of an exported model with the model it came from: the same prompts answered greedily by
both, compared token by token. Pure: the answers come from tuiapp.trainer.tools.parity (transformers,
peft, llama-cpp-python) as token ids and their texts.

Greedy decoding agrees token for token until the first difference, after which the two answers
follow different contexts; so a prompt's agreement is the length of the common prefix over the
longer answer, and the report's agreement is the sum of the common prefixes over the sum of the
longer answers. The first diverging token is named for each prompt (position and both tokens).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

DEFAULT_MIN_AGREEMENT = 0.75
DEFAULT_PROMPTS = ["Who are you?", "What is the capital of France?", "Write one sentence about the sea."]


@dataclass
class Answer:
    ids: list[int]
    pieces: list[str]  # each id decoded alone
    text: str = ""


@dataclass
class PromptParity:
    prompt: str
    reference: str
    exported: str
    common: int
    longest: int
    first_divergence: dict | None  # {"index", "reference", "exported"}, None when they agree
    prompt_tokens_match: bool = True

    @property
    def agreement(self) -> float:
        return 1.0 if self.longest == 0 else self.common / self.longest


@dataclass
class ParityReport:
    reference: str  # e.g. "transformers (adapter on its base)"
    exported: str  # e.g. "model-q8_0.gguf (llama.cpp)"
    prompts: list[PromptParity] = field(default_factory=list)
    min_agreement: float = DEFAULT_MIN_AGREEMENT

    @property
    def agreement(self) -> float:
        longest = sum(p.longest for p in self.prompts)
        return 1.0 if longest == 0 else sum(p.common for p in self.prompts) / longest

    @property
    def passed(self) -> bool:
        return self.agreement >= self.min_agreement and all(p.prompt_tokens_match for p in self.prompts)

    def as_dict(self) -> dict:
        return {"reference": self.reference, "exported": self.exported, "agreement": round(self.agreement, 4),
                "min_agreement": self.min_agreement, "passed": self.passed,
                "prompts": [{**asdict(p), "agreement": round(p.agreement, 4)} for p in self.prompts]}


def compare(prompt: str, reference: Answer, exported: Answer, prompt_tokens_match: bool = True) -> PromptParity:
    common = 0
    while common < min(len(reference.ids), len(exported.ids)) and reference.ids[common] == exported.ids[common]:
        common += 1
    longest = max(len(reference.ids), len(exported.ids))
    divergence = None
    if common < longest:
        def piece(answer: Answer) -> str | None:
            return answer.pieces[common] if common < len(answer.pieces) else None  # None: that answer ended

        divergence = {"index": common, "reference": piece(reference), "exported": piece(exported)}
    return PromptParity(prompt, reference.text, exported.text, common, longest, divergence, prompt_tokens_match)


def lines(report: ParityReport) -> list[str]:
    """The side-by-side report the export prints."""
    verdict = "ok" if report.passed else "FAILED"
    out = [f"parity {report.exported} vs {report.reference}: {report.agreement:.0%} of greedy tokens agree "
           f"(min {report.min_agreement:.0%}) — {verdict}"]
    for p in report.prompts:
        out.append(f"  prompt: {p.prompt!r}  ({p.agreement:.0%})")
        out.append(f"    reference: {p.reference!r}")
        out.append(f"    exported:  {p.exported!r}")
        if p.first_divergence:
            d = p.first_divergence
            out.append(f"    first diverging token #{d['index']}: {d['reference']!r} vs {d['exported']!r}"
                       " (None = that answer had ended)")
        if not p.prompt_tokens_match:
            out.append("    ! the prompt tokenizes differently: the exported tokenizer is not the model's")
    return out
