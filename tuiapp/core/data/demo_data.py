"""Offline demo datasets built from one small, fixed world of facts.

Short answers in a repeated format ("The capital of France is Paris.") let a ~1M-parameter
model learn them visibly in a minute or two on a CPU. Every fact is asked with several
phrasings; a few phrasings are held out of training so `facts_eval_pairs()` can show that
a fine-tuned model answers better than its base. Everything is deterministic.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

from tuiapp.core.common.errors import DatasetError, did_you_mean
from tuiapp.core.config.tools import CALCULATOR_SCHEMA, calculate, number_text
from tuiapp.core.data import demo_shapes

# Bump when the generated records change, so cached tokenized data is rebuilt.
DEMO_VERSION = "8"

CAPITALS = [
    ("France", "Paris"), ("Germany", "Berlin"), ("Italy", "Rome"), ("Spain", "Madrid"),
    ("Portugal", "Lisbon"), ("Japan", "Tokyo"), ("China", "Beijing"), ("India", "New Delhi"),
    ("Russia", "Moscow"), ("Egypt", "Cairo"), ("Kenya", "Nairobi"), ("Canada", "Ottawa"),
    ("Mexico", "Mexico City"), ("Brazil", "Brasilia"), ("Argentina", "Buenos Aires"),
    ("Peru", "Lima"), ("Chile", "Santiago"), ("Australia", "Canberra"), ("Norway", "Oslo"),
    ("Sweden", "Stockholm"), ("Finland", "Helsinki"), ("Denmark", "Copenhagen"),
    ("Poland", "Warsaw"), ("Greece", "Athens"), ("Turkey", "Ankara"), ("Ireland", "Dublin"),
    ("Austria", "Vienna"), ("Hungary", "Budapest"), ("Belgium", "Brussels"),
    ("the Netherlands", "Amsterdam"), ("Switzerland", "Bern"), ("Thailand", "Bangkok"),
    ("Vietnam", "Hanoi"), ("South Korea", "Seoul"), ("Indonesia", "Jakarta"), ("Iran", "Tehran"),
    ("Cuba", "Havana"), ("Colombia", "Bogota"), ("Nigeria", "Abuja"), ("Ghana", "Accra"),
]
ANIMAL_SOUNDS = [
    ("cow", "moo"), ("dog", "woof"), ("cat", "meow"), ("duck", "quack"), ("sheep", "baa"),
    ("pig", "oink"), ("horse", "neigh"), ("lion", "roar"), ("owl", "hoot"), ("snake", "hiss"),
    ("frog", "ribbit"), ("bee", "buzz"), ("mouse", "squeak"), ("donkey", "hee-haw"),
    ("crow", "caw"), ("wolf", "howl"), ("turkey", "gobble"), ("chick", "cheep"),
    ("goose", "honk"), ("dove", "coo"),
]
COLOUR_MIXES = [
    ("red", "blue", "purple"), ("red", "yellow", "orange"), ("blue", "yellow", "green"),
    ("red", "white", "pink"), ("black", "white", "grey"), ("blue", "white", "light blue"),
    ("red", "black", "maroon"), ("blue", "black", "navy"), ("purple", "white", "lavender"),
    ("red", "green", "brown"),
]
OPPOSITES = [
    ("hot", "cold"), ("big", "small"), ("up", "down"), ("fast", "slow"), ("happy", "sad"),
    ("day", "night"), ("wet", "dry"), ("open", "closed"), ("full", "empty"), ("early", "late"),
    ("high", "low"), ("hard", "soft"), ("loud", "quiet"), ("rich", "poor"), ("strong", "weak"),
    ("thick", "thin"), ("left", "right"), ("in", "out"), ("young", "old"), ("win", "lose"),
    ("push", "pull"), ("start", "finish"), ("buy", "sell"), ("true", "false"),
    ("clean", "dirty"), ("long", "short"), ("heavy", "light"), ("sweet", "sour"),
    ("first", "last"), ("near", "far"),
]
WORDS = [
    "cat", "dog", "sun", "moon", "star", "tree", "fish", "bird", "book", "lamp", "door", "rain",
    "snow", "wind", "milk", "cake", "frog", "ship", "road", "hill", "rose", "gold", "ring",
    "bell", "drum", "kite", "leaf", "nest", "salt", "corn", "apple", "river", "house", "chair",
    "bread", "table", "music", "garden", "pencil", "window",
]
PLURALS = [
    ("cat", "cats"), ("mouse", "mice"), ("child", "children"), ("foot", "feet"),
    ("tooth", "teeth"), ("man", "men"), ("woman", "women"), ("box", "boxes"), ("bus", "buses"),
    ("baby", "babies"), ("city", "cities"), ("leaf", "leaves"), ("knife", "knives"),
    ("goose", "geese"), ("sheep", "sheep"), ("fish", "fish"), ("person", "people"),
    ("wolf", "wolves"), ("potato", "potatoes"), ("dish", "dishes"),
]
NUMBERS = [
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
    "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen",
    "nineteen", "twenty",
]
SYSTEM_PROMPTS = [
    "You are a helpful assistant.",
    "You are a concise assistant. Answer in one sentence.",
    "You answer questions about capitals, animals, colours and words.",
]


@dataclass(frozen=True)
class Fact:
    """One fact: the values its phrasings are filled with, and its one-sentence answer."""

    topic: str
    slots: dict
    answer: str
    value: str = ""  # the part of the answer that carries the fact ("Paris")

    def with_value(self, value: str) -> str:
        """The answer with another value in place of this fact's: a wrong answer."""
        head, _, tail = self.answer.rpartition(self.value)
        return head + value + tail


def _article(word: str) -> str:
    return f"an {word}" if word[0] in "aeiou" else f"a {word}"


def _facts() -> list[Fact]:
    facts = [
        Fact("capital", {"x": country}, f"The capital of {country} is {capital}.", capital)
        for country, capital in CAPITALS
    ]
    for animal, sound in ANIMAL_SOUNDS:
        a_animal = _article(animal)
        facts.append(Fact("sound", {"x": a_animal}, f"{a_animal.capitalize()} says {sound}.", sound))
    for first, second, mix in COLOUR_MIXES:
        for a, b in ((first, second), (second, first)):
            facts.append(Fact("colour", {"x": a, "y": b}, f"{a.capitalize()} and {b} make {mix}.", mix))
    for word, opposite in OPPOSITES:
        for a, b in ((word, opposite), (opposite, word)):
            facts.append(Fact("opposite", {"x": a}, f"The opposite of {a} is {b}.", b))
    for word in WORDS:
        facts.append(Fact("backwards", {"x": word}, f"{word.capitalize()} backwards is {word[::-1]}.",
                          word[::-1]))
        facts.append(Fact("letters", {"x": word}, f"{word.capitalize()} has {NUMBERS[len(word)]} letters.",
                          NUMBERS[len(word)]))
    for noun, plural in PLURALS:
        facts.append(Fact("plural", {"x": noun}, f"The plural of {noun} is {plural}.", plural))
    for number, following in zip(NUMBERS, NUMBERS[1:], strict=False):  # each number with the next
        facts.append(Fact("after", {"x": number}, f"After {number} comes {following}.", following))
    return facts


# Phrasings per topic as (instruction, input). The last one of each list is held out
# of training and used only by facts_eval_pairs().
PHRASINGS = {
    "capital": [
        ("What is the capital of {x}?", ""),
        ("Name the capital city of {x}.", ""),
        ("Tell me the capital of {x}.", ""),
        ("What city is the capital of {x}?", ""),
        ("What is the capital of this country?", "{x}"),
        ("Answer the question.", "What is the capital of {x}?"),
        ("Which city is the capital of {x}?", ""),
    ],
    "sound": [
        ("What sound does {x} make?", ""),
        ("What does {x} say?", ""),
        ("Tell me the sound {x} makes.", ""),
        ("What sound does this animal make?", "{x}"),
        ("Answer the question.", "What does {x} say?"),
        ("Which sound does {x} make?", ""),
        ("What noise does {x} make?", ""),
    ],
    "colour": [
        ("What do you get when you mix {x} and {y}?", ""),
        ("What colour is made by mixing {x} and {y}?", ""),
        ("If you mix {x} and {y}, what colour do you get?", ""),
        ("What colour do these two colours make?", "{x} and {y}"),
        ("Answer the question.", "What do you get when you mix {x} and {y}?"),
        ("Which colour comes from mixing {x} and {y}?", ""),
    ],
    "opposite": [
        ("What is the opposite of {x}?", ""),
        ("Give the opposite of {x}.", ""),
        ("Tell me the opposite of the word {x}.", ""),
        ("What is the opposite of this word?", "{x}"),
        ("Answer the question.", "What is the opposite of {x}?"),
        ("Name the opposite of {x}.", ""),
        ("What word is the opposite of {x}?", ""),
    ],
    "backwards": [
        ("Spell {x} backwards.", ""),
        ("Write the word {x} backwards.", ""),
        ("What is {x} spelled backwards?", ""),
        ("Spell this word backwards.", "{x}"),
        ("Answer the question.", "What is {x} spelled backwards?"),
        ("How do you spell {x} backwards?", ""),
    ],
    "letters": [
        ("How many letters are in {x}?", ""),
        ("Count the letters in {x}.", ""),
        ("How many letters does the word {x} have?", ""),
        ("How many letters are in this word?", "{x}"),
        ("Answer the question.", "How many letters are in {x}?"),
        ("What is the number of letters in {x}?", ""),
    ],
    "plural": [
        ("What is the plural of {x}?", ""),
        ("Give the plural of {x}.", ""),
        ("What is the plural form of the word {x}?", ""),
        ("What is the plural of this word?", "{x}"),
        ("Answer the question.", "What is the plural of {x}?"),
        ("Tell me the plural of {x}.", ""),
        ("How do you say more than one {x}?", ""),
    ],
    "after": [
        ("What number comes after {x}?", ""),
        ("Which number follows {x}?", ""),
        ("Count on from {x}. What comes next?", ""),
        ("What number comes after this one?", "{x}"),
        ("Answer the question.", "What number comes after {x}?"),
        ("What is the next number after {x}?", ""),
    ],
}
HELD_OUT = 1  # phrasings at the end of each list that training never sees


def _fill(template: str, fact: Fact) -> str:
    text = template.format(**fact.slots)
    return text[0].upper() + text[1:]


def _training_questions(fact: Fact) -> list[tuple[str, str]]:
    phrasings = PHRASINGS[fact.topic][:-HELD_OUT]
    return [(_fill(i, fact), _fill(x, fact) if x else "") for i, x in phrasings]


def _as_question(instruction: str, input_text: str) -> str:
    return f"{instruction}\n{input_text}" if input_text else instruction


def facts_records() -> list[dict]:
    """Alpaca records {instruction, input, output}: every fact in every training phrasing."""
    records = [
        {"instruction": instruction, "input": input_text, "output": fact.answer}
        for fact in _facts()
        for instruction, input_text in _training_questions(fact)
    ]
    random.Random(1234).shuffle(records)
    return records


def facts_eval_pairs() -> list[tuple[str, str]]:
    """(question, expected answer sentence) in phrasings held out from training."""
    return [
        (_fill(instruction, fact), fact.answer)
        for fact in _facts()
        for instruction, _ in PHRASINGS[fact.topic][-HELD_OUT:]
    ]


def chat_records(count: int = 800) -> list[dict]:
    """OpenAI-style {"messages": [...]} conversations of 2-3 fact turns, some with a system prompt."""
    rng = random.Random(5678)
    facts = _facts()
    records = []
    for _ in range(count):
        messages = []
        if rng.random() < 0.4:
            messages.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
        for fact in rng.sample(facts, rng.choice((2, 3))):
            question = _as_question(*rng.choice(_training_questions(fact)))
            messages.append({"role": "user", "content": question})
            messages.append({"role": "assistant", "content": fact.answer})
        records.append({"messages": messages})
    return records


def _statements(fact: Fact) -> list[str]:
    """Plain sentences stating a fact, for the text corpus."""
    if fact.topic == "capital":
        capital = fact.answer.rsplit(" is ", 1)[1].rstrip(".")
        return [fact.answer, f"{capital} is the capital of {fact.slots['x']}."]
    return [fact.answer]


def text_records(count: int = 2000) -> list[dict]:
    """{"text": paragraph} of 3-6 templated sentences about the same facts."""
    rng = random.Random(9012)
    facts = _facts()
    return [
        {"text": " ".join(rng.choice(_statements(fact)) for fact in rng.sample(facts, rng.randint(3, 6)))}
        for _ in range(count)
    ]


EVASIVE_ANSWERS = [
    "I don't know.", "I am not sure, sorry.", "Ask someone else.", "That is a hard question.",
    "I cannot answer that.", "Nobody knows.",
]


def _bad_answer(fact: Fact, facts: list[Fact], rng: random.Random) -> str:
    """A worse answer: half the time the same sentence with the value of another fact of the topic
    ("The capital of France is Rome."), else an evasive reply or another topic's fact."""
    roll = rng.random()
    if roll < 0.5:
        values = sorted({f.value for f in facts if f.topic == fact.topic and f.value != fact.value})
        return fact.with_value(rng.choice(values))
    if roll < 0.75:
        return rng.choice(EVASIVE_ANSWERS)
    return rng.choice([f for f in facts if f.topic != fact.topic]).answer


def _judged_questions(seed: int, count: int):
    """(question, right answer, worse answer), fact by fact in random training phrasings."""
    rng = random.Random(seed)
    facts = _facts()
    for _ in range(count):
        fact = rng.choice(facts)
        question = _as_question(*rng.choice(_training_questions(fact)))
        yield question, fact.answer, _bad_answer(fact, facts, rng)


def preference_records(count: int = 600) -> list[dict]:
    """Preference pairs in messages format: {"messages": [user], "chosen": {assistant: the fact},
    "rejected": {assistant: a worse answer (a wrong value, an evasion, another topic)}}."""
    return [
        {"messages": [{"role": "user", "content": question}],
         "chosen": {"role": "assistant", "content": right},
         "rejected": {"role": "assistant", "content": wrong}}
        for question, right, wrong in _judged_questions(3456, count)
    ]


def feedback_records(count: int = 600) -> list[dict]:
    """Unpaired feedback (KTO): {"messages": [user, assistant], "label": true when the answer is the
    fact, false for a worse one}; half of each."""
    records = []
    for index, (question, right, wrong) in enumerate(_judged_questions(7890, count)):
        good = index % 2 == 0
        records.append({"messages": [{"role": "user", "content": question},
                                     {"role": "assistant", "content": right if good else wrong}],
                        "label": good})
    return records


ARITH_NAMES = ["Tom", "Anna", "Sam", "Mia", "Leo", "Zoe", "Ben", "Ivy", "Max", "Eva"]
ARITH_THINGS = ["apples", "books", "coins", "stickers", "pencils", "marbles", "cookies", "cards", "shells", "stamps"]


def arith_records(count: int = 1000) -> list[dict]:
    """Arithmetic word problems with their answers, for online RL (grpo/rloo): {"prompt": text,
    "answer": "12"}; sums, differences and products of small numbers."""
    rng = random.Random(2468)
    records = []
    for _ in range(count):
        name, thing = rng.choice(ARITH_NAMES), rng.choice(ARITH_THINGS)
        op = rng.choice(("add", "sub", "mul"))
        if op == "add":
            a, b = rng.randint(1, 50), rng.randint(1, 50)
            question, answer = f"{name} has {a} {thing} and gets {b} more. How many {thing} does {name} have now?", a + b
        elif op == "sub":
            a = rng.randint(2, 60)
            b = rng.randint(1, a - 1)
            question, answer = f"{name} has {a} {thing} and gives {b} away. How many {thing} are left?", a - b
        else:
            a, b = rng.randint(2, 9), rng.randint(2, 9)
            question, answer = f"{name} buys {a} bags with {b} {thing} in each. How many {thing} is that?", a * b
        records.append({"prompt": f"{question} Answer with the number only.", "answer": str(answer)})
    return records


# "Is 7 odd?" asked in these phrasings; the last two are held out of training (demo:digits-heldout)
DIGIT_PHRASINGS = ["Is {d} odd? Answer 1 for yes, 0 for no.", "Is the digit {d} odd? Say 1 for yes or 0 for no.",
                   "Odd or not: {d}? Write 1 if odd, 0 if even.", "Tell me if {d} is odd: 1 for yes, 0 for no.",
                   "Is {d} an odd number? Reply 1 (yes) or 0 (no).", "Check whether {d} is odd. 1 = odd, 0 = even.",
                   "Is {d} odd or even? Answer 1 for odd, 0 for even.", "Say 1 if {d} is odd, else 0."]


def digits_records(count: int = 1000, heldout: bool = False) -> list[dict]:
    """demo:digits: is a digit odd, answered 1 or 0 (the smallest task the tiny model improves on by
    online RL on CPU in a minute): {"prompt": "Is 7 odd? Answer 1 for yes, 0 for no.", "answer": "1",
    "guess": a random digit}. `guess` is the SFT target of the RL presets' first step (tiny-rl-format): it
    teaches the answer's format (one digit, then the end of the turn) and leaves the answer right only by
    chance (about 1 in 10). The held-out records ask in phrasings never trained on."""
    rng = random.Random(9753 if heldout else 2468)
    phrasings = DIGIT_PHRASINGS[-2:] if heldout else DIGIT_PHRASINGS[:-2]
    out = []
    for _ in range(count):
        digit = rng.randint(0, 9)
        out.append({"prompt": rng.choice(phrasings).format(d=digit), "answer": str(digit % 2),
                    "guess": str(rng.randint(0, 9))})
    return out


def digits_heldout_records() -> list[dict]:
    """demo:digits-heldout: alpaca records (instruction -> 1 or 0) for `llmtui eval`'s exact match, which
    keep demo:digits' prompt and answer columns for the RL presets' evaluations (dataset.eval_split)."""
    return [{"instruction": r["prompt"], "input": "", "output": r["answer"], "prompt": r["prompt"],
             "answer": r["answer"]} for r in digits_records(200, heldout=True)]


CALC_OPS = ("+", "-", "*")


def _calc_problems() -> tuple[list[tuple[int, str, int]], list[tuple[int, str, int]]]:
    """(training, held-out) problems `a op b` over two-digit numbers: too big for the tiny model to work out,
    so only the calculator answers them; 200 of them are never trained on."""
    problems = [(a, op, b) for a in range(10, 100) for b in range(10, 100) for op in CALC_OPS]
    random.Random(4321).shuffle(problems)
    return problems[200:], problems[:200]


def _calc_row(a: int, op: str, b: int) -> dict:
    """The problem and its answer, as the calculator environment computes it."""
    return {"prompt": f"What is {a} {op} {b}?", "answer": number_text(calculate(f"{a} {op} {b}"))}


def calc_records(count: int = 1000) -> list[dict]:
    """demo:calc: {"prompt": "What is 56 * 39?", "answer": "2184"}, for tool-using online RL with the calculator
    environment."""
    rng = random.Random(8642)
    training, _ = _calc_problems()
    return [_calc_row(*rng.choice(training)) for _ in range(count)]


def calc_heldout_records() -> list[dict]:
    """demo:calc-heldout: the 200 problems never trained on, the tool-using runs' evaluations (dataset.eval_split)."""
    return [_calc_row(*problem) for problem in _calc_problems()[1]]


def _calc_transcripts(count: int, seed: int, turns) -> list[dict]:
    """`count` records {"messages": turns(rng, training problems), "tools": the calculator's schema}."""
    rng = random.Random(seed)
    training, _ = _calc_problems()
    tools = json.dumps([CALCULATOR_SCHEMA])
    return [{"messages": turns(rng, training), "tools": tools} for _ in range(count)]


def _tool_turns(a: int, op: str, b: int) -> list[dict]:
    """The problem, the calculator's call with it, the tool's result and the answer, which is that result."""
    row = _calc_row(a, op, b)
    call = {"name": "calculate", "arguments": {"expression": f"{a} {op} {b}"}}
    return [{"role": "user", "content": row["prompt"]}, {"role": "tool_call", "content": json.dumps(call)},
            {"role": "tool", "content": row["answer"]}, {"role": "assistant", "content": row["answer"]}]


def calc_tool_records(count: int = 16000) -> list[dict]:
    """demo:calc-tools: transcripts (messages + tools) of demo:calc's training problems in which the assistant
    calls the calculator with the problem and answers its result, rendered as TRL's tool loop writes a rollout:
    an SFT step on them teaches a model the call before tool-using RL."""
    return _calc_transcripts(count, 9753, lambda rng, training: _tool_turns(*rng.choice(training)))


def calc_guess_records(count: int = 4000) -> list[dict]:
    """demo:calc-guess: demo:calc's training problems answered at once, without the calculator, by a guess: the
    answer of another problem (a number that looks right and almost never is), as a model that does sums in its
    head would. Mixed with demo:calc-tools in an SFT step, the tuned model calls the tool only sometimes, so
    tool-using RL has to learn when the calculator pays (tiny-agent-mix)."""

    def turns(rng: random.Random, training: list) -> list[dict]:
        row, other = _calc_row(*rng.choice(training)), _calc_row(*rng.choice(training))
        return [{"role": "user", "content": row["prompt"]}, {"role": "assistant", "content": other["answer"]}]

    return _calc_transcripts(count, 8643, turns)


def arith_preference_records(count: int = 600) -> list[dict]:
    """demo:arith's problems as preference pairs, to train a reward model that an RL run then uses:
    {"prompt", "chosen": the answer, "rejected": a wrong number or a sentence instead of the number}."""
    rng = random.Random(1357)
    records = []
    for record in arith_records(count):
        answer = int(record["answer"])
        if rng.random() < 0.5:
            wrong = str(answer + rng.choice([-1, 1]) * rng.randint(1, 9))
        else:
            wrong = rng.choice(["I am not sure.", f"The answer is around {answer}.", "Let me think about it."])
        records.append({"prompt": record["prompt"], "chosen": record["answer"], "rejected": wrong})
    return records


DEMO_DATASETS = {
    "demo:facts": "~1500 alpaca instructions about capitals, animal sounds, colours and words.",
    "demo:chat": "800 multi-turn chats (messages format) about the same facts, some with a system prompt.",
    "demo:text": "2000 plain-text paragraphs stating the same facts, for pretraining.",
    "demo:prefs": "600 preference pairs (messages + chosen/rejected): the fact vs a worse answer (a wrong "
                  "value, an evasion or another topic), for dpo/simpo/cpo/orpo/reward.",
    "demo:feedback": "600 answers labelled good (the fact) or bad (a worse answer), messages + label, for kto.",
    "demo:arith": "1000 arithmetic word problems (prompt + answer) for online RL (grpo/rloo).",
    "demo:digits": "1000 questions whether a digit is odd, answered 1 or 0 (prompt + answer + guess, a random digit "
                   "for a format-only SFT step), for online RL the tiny model improves on, on CPU.",
    "demo:digits-heldout": "200 demo:digits questions in phrasings never trained on (alpaca), for `llmtui eval`.",
    "demo:calc": "1000 problems `a + b`, `a - b`, `a * b` over two-digit numbers (prompt + answer), for tool-using "
                 "online RL with the calculator environment.",
    "demo:calc-heldout": "200 demo:calc problems never trained on, for the evaluations of a tool-using run.",
    "demo:calc-tools": "16000 transcripts of demo:calc problems (messages + tools) that call the calculator and "
                       "answer its result, for an SFT step before tool-using RL.",
    "demo:calc-guess": "4000 transcripts of demo:calc problems (messages + tools) answered at once by a guess (another "
                       "problem's answer), without the calculator: mixed with demo:calc-tools, a base that seldom "
                       "calls the tool.",
    "demo:arith-prefs": "600 of those problems as preference pairs (prompt/chosen/rejected): the bare answer vs a "
                        "wrong number or a sentence, for a reward model an RL run scores with.",
    "demo:facts-heldout": "alpaca questions about the demo facts in phrasings never trained on, for `llmtui eval`.",
    "demo:shapes": "600 pictures of 1-3 coloured shapes (64x64 PNG, drawn offline) with a question about a shape's "
                   "colour, the count or a position and a one-word answer (messages + images), for vision models.",
    "demo:shapes-heldout": "100 more demo:shapes pictures and questions, never trained on, for evaluation.",
}


def facts_heldout_records() -> list[dict]:
    """Alpaca records of `facts_eval_pairs()`: held-out phrasings, to evaluate a demo:facts run."""
    return [{"instruction": question, "input": "", "output": answer} for question, answer in facts_eval_pairs()]


_BUILDERS = {"demo:facts": facts_records, "demo:chat": chat_records, "demo:text": text_records,
             "demo:prefs": preference_records, "demo:feedback": feedback_records,
             "demo:facts-heldout": facts_heldout_records, "demo:arith": arith_records,
             "demo:arith-prefs": arith_preference_records, "demo:digits": digits_records,
             "demo:digits-heldout": digits_heldout_records, "demo:calc": calc_records,
             "demo:calc-heldout": calc_heldout_records, "demo:calc-tools": calc_tool_records,
             "demo:calc-guess": calc_guess_records,
             "demo:shapes": demo_shapes.shapes_records,
             "demo:shapes-heldout": lambda: demo_shapes.shapes_records(heldout=True)}


def demo_records(name: str) -> list[dict]:
    """Records of a demo dataset by name ('demo:facts', 'demo:chat', 'demo:text')."""
    if name not in _BUILDERS:
        hint = did_you_mean(name, _BUILDERS) or f"use one of: {', '.join(_BUILDERS)}"
        raise DatasetError(message=f"unknown demo dataset '{name}'", key="dataset.name", fix=hint)
    return _BUILDERS[name]()
