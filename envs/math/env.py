"""Generated arithmetic word problems, answered with a single `submit` call."""

import os
import random
import re
from collections.abc import Callable, Mapping
from decimal import Decimal, InvalidOperation

from ors import Environment, JSONObject, Split, TextBlock, ToolOutput, tool
from pydantic import BaseModel, Field

SPLIT_SIZES: dict[str, int] = {"train": 10_000, "test": 1_000}

NAMES = (
    "Ava",
    "Ben",
    "Chloe",
    "Daniel",
    "Emma",
    "Farid",
    "Grace",
    "Hiro",
    "Isla",
    "Jonas",
    "Kemi",
    "Liam",
    "Maya",
    "Noah",
    "Olivia",
    "Priya",
    "Quinn",
    "Rosa",
    "Sam",
    "Tariq",
)
ITEMS = (
    "apples",
    "marbles",
    "stickers",
    "pencils",
    "cookies",
    "books",
    "shells",
    "stamps",
    "cards",
    "balloons",
    "oranges",
    "coins",
)

Problem = tuple[str, int]


def _add(rng: random.Random) -> Problem:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    a, b = rng.randint(5, 500), rng.randint(5, 500)
    return f"{name} has {a} {item} and finds {b} more. How many {item} does {name} have now?", a + b


def _subtract(rng: random.Random) -> Problem:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    a = rng.randint(20, 900)
    b = rng.randint(1, a - 1)
    return f"{name} had {a} {item} and gave away {b}. How many {item} does {name} have left?", a - b


def _multiply(rng: random.Random) -> Problem:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    boxes, per_box = rng.randint(2, 40), rng.randint(2, 25)
    return (
        f"{name} buys {boxes} boxes of {item}. Each box holds {per_box} {item}. "
        f"How many {item} does {name} buy in total?",
        boxes * per_box,
    )


def _divide(rng: random.Random) -> Problem:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    friends, each = rng.randint(2, 12), rng.randint(2, 30)
    return (
        f"{name} shares {friends * each} {item} equally among {friends} friends. "
        f"How many {item} does each friend get?",
        each,
    )


def _two_step(rng: random.Random) -> Problem:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    start, packs, per_pack = rng.randint(0, 100), rng.randint(2, 9), rng.randint(2, 12)
    given = rng.randint(1, start + packs * per_pack)
    return (
        f"{name} starts with {start} {item}, buys {packs} packs of {per_pack} {item}, "
        f"then gives {given} {item} to a friend. How many {item} does {name} have now?",
        start + packs * per_pack - given,
    )


def _distance(rng: random.Random) -> Problem:
    speed, hours = rng.randint(20, 120), rng.randint(2, 9)
    return (
        f"A train travels at {speed} km per hour for {hours} hours. How many kilometres does it travel?",
        speed * hours,
    )


def _money(rng: random.Random) -> Problem:
    name = rng.choice(NAMES)
    spent_a, spent_b = rng.randint(1, 60), rng.randint(1, 60)
    budget = spent_a + spent_b + rng.randint(0, 100)
    return (
        f"{name} has {budget} dollars, spends {spent_a} dollars on lunch and {spent_b} dollars on a book. "
        f"How many dollars does {name} have left?",
        budget - spent_a - spent_b,
    )


TEMPLATES: tuple[Callable[[random.Random], Problem], ...] = (
    _add,
    _subtract,
    _multiply,
    _divide,
    _two_step,
    _distance,
    _money,
)

_THOUSANDS = re.compile(r"[+-]?\d{1,3}(,\d{3})+(\.\d+)?")
_task_cache: dict[str, list[JSONObject]] = {}


def _check_split(split: str) -> int:
    if split not in SPLIT_SIZES:
        raise ValueError(f"unknown split {split!r}; expected one of {sorted(SPLIT_SIZES)}")
    return SPLIT_SIZES[split]


def _make_task(split: str, index: int) -> JSONObject:
    # A string seed is hashed with SHA-512, so task i is identical across processes and runs.
    rng = random.Random(f"math/{split}/{index}")
    question, answer = rng.choice(TEMPLATES)(rng)
    return {"id": f"{split}-{index}", "question": question, "answer": str(answer)}


def _parse_number(text: str) -> Decimal | None:
    text = text.strip()
    if _THOUSANDS.fullmatch(text):
        text = text.replace(",", "")
    try:
        value = Decimal(text)
    except InvalidOperation:
        return None
    return value if value.is_finite() else None


def answers_match(submitted: str, expected: str) -> bool:
    got, want = _parse_number(submitted), _parse_number(expected)
    if got is None or want is None:
        return submitted.strip() == expected.strip()
    return abs(got - want) <= Decimal("1e-9")


class SubmitParams(BaseModel):
    answer: str = Field(description="Your final answer, as a number.")


class Math(Environment):
    def __init__(self, task_spec: JSONObject | None = None, secrets: Mapping[str, str] | None = None) -> None:
        super().__init__(task_spec or {}, secrets or {})
        # Held only so tests can confirm secrets are delivered; never read or echoed.
        self._secrets: dict[str, str] = dict(secrets or {})

    @classmethod
    def list_splits(cls) -> list[Split]:
        return [Split(name="train", type="train"), Split(name="test", type="test")]

    @classmethod
    def list_tasks(cls, split: str) -> list[JSONObject]:
        size = _check_split(split)
        if split not in _task_cache:
            _task_cache[split] = [_make_task(split, i) for i in range(size)]
        return list(_task_cache[split])

    @classmethod
    async def num_tasks(cls, split: str) -> int:
        return _check_split(split)

    @classmethod
    async def get_task(cls, split: str, index: int) -> JSONObject:
        size = _check_split(split)
        # Same semantics as indexing the list from list_tasks, negative indices included.
        if not -size <= index < size:
            raise IndexError(f"task index {index} out of range for split {split!r} ({size} tasks)")
        return _make_task(split, index % size)

    def get_prompt(self) -> list[TextBlock]:
        question = str(self.task_spec["question"])
        return [
            TextBlock(text=f"{question}\n\nCall the `submit` tool with your final answer as a plain number.")
        ]

    @tool
    def submit(self, params: SubmitParams) -> ToolOutput:
        """Submit your final numeric answer. Ends the episode."""
        correct = answers_match(params.answer, str(self.task_spec["answer"]))
        text = "Correct." if correct else "Incorrect."
        return ToolOutput(
            blocks=[TextBlock(text=text)],
            metadata={"correct": correct, "secrets_seen": sorted(self._secrets)},
            reward=1.0 if correct else 0.0,
            finished=True,
        )


if __name__ == "__main__":
    from ors import Server

    Server([Math]).run(port=int(os.environ.get("PORT", "8080")))
