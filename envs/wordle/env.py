"""A Wordle-like game: guess a secret five-letter word within six turns."""

import functools
import os
import random
import re
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

from ors import Environment, JSONObject, Split, TextBlock, ToolOutput, tool
from pydantic import BaseModel, Field

MAX_TURNS = 6
TEST_SIZE = 80
WORDS_FILE = Path(__file__).parent / "words.txt"
_WORD = re.compile(r"[a-z]{5}")


@functools.cache
def _split_words() -> dict[str, tuple[str, ...]]:
    words = sorted({line.strip() for line in WORDS_FILE.read_text().splitlines() if line.strip()})
    # Fixed-seed shuffle so the test split is a spread of the alphabet, not a run of "a" words.
    random.Random("wordle/splits").shuffle(words)
    return {"test": tuple(words[:TEST_SIZE]), "train": tuple(words[TEST_SIZE:])}


def score_guess(guess: str, secret: str) -> str:
    """Per-letter feedback: G = right letter and spot, Y = elsewhere in the word, _ = absent.

    A letter repeated in the guess is marked Y only as many times as it still
    occurs in the secret after exact matches are taken out.
    """
    marks = ["_"] * len(guess)
    unmatched = Counter(s for g, s in zip(guess, secret, strict=True) if g != s)
    for i, (g, s) in enumerate(zip(guess, secret, strict=True)):
        if g == s:
            marks[i] = "G"
    for i, g in enumerate(guess):
        if marks[i] != "G" and unmatched[g] > 0:
            marks[i] = "Y"
            unmatched[g] -= 1
    return "".join(marks)


class GuessParams(BaseModel):
    word: str = Field(description="A five-letter word using the letters a-z.")


class Wordle(Environment):
    def __init__(self, task_spec: JSONObject | None = None, secrets: Mapping[str, str] | None = None) -> None:
        super().__init__(task_spec or {}, secrets or {})
        self._secrets: dict[str, str] = dict(secrets or {})
        self.turns: list[tuple[str, str]] = []
        self.finished = False

    @classmethod
    def list_splits(cls) -> list[Split]:
        return [Split(name="train", type="train"), Split(name="test", type="test")]

    @classmethod
    def list_tasks(cls, split: str) -> list[JSONObject]:
        splits = _split_words()
        if split not in splits:
            raise ValueError(f"unknown split {split!r}; expected one of {sorted(splits)}")
        return [{"id": f"{split}-{i}", "secret_word": word} for i, word in enumerate(splits[split])]

    @property
    def secret_word(self) -> str:
        word = str(self.task_spec.get("secret_word", "")).strip().lower()
        if not _WORD.fullmatch(word):
            raise ValueError("task_spec['secret_word'] must be a five-letter word")
        return word

    def get_prompt(self) -> list[TextBlock]:
        return [
            TextBlock(
                text=(
                    f"Guess the secret five-letter English word in at most {MAX_TURNS} turns. "
                    "Call the `guess` tool with one word per call. After each guess you get one mark per letter: "
                    "G = correct letter in the correct position, Y = the letter is in the word but in another position, "
                    "_ = the letter is not in the word (or not that many times). "
                    "Invalid guesses (not exactly five letters a-z) do not use up a turn."
                )
            )
        ]

    @tool
    def guess(self, params: GuessParams) -> ToolOutput:
        """Guess the secret five-letter word; returns G/Y/_ feedback for each letter."""
        if self.finished:
            return ToolOutput(
                blocks=[TextBlock(text="The game is over; no more guesses are accepted.")],
                reward=0.0,
                finished=True,
            )

        word = params.word.strip().lower()
        if not _WORD.fullmatch(word):
            return ToolOutput(
                blocks=[
                    TextBlock(
                        text=f"Invalid guess {params.word!r}: a guess must be exactly five letters a-z. "
                        "This did not use up a turn."
                    )
                ],
                metadata={"turn": len(self.turns), "turns_left": MAX_TURNS - len(self.turns)},
                reward=0.0,
                finished=False,
            )

        secret = self.secret_word
        feedback = score_guess(word, secret)
        self.turns.append((word, feedback))
        turn = len(self.turns)
        solved = word == secret
        self.finished = solved or turn >= MAX_TURNS

        lines = [f"Turn {turn}/{MAX_TURNS}: {word.upper()} -> {feedback}"]
        if solved:
            lines.append(f"Solved in {turn} turn{'s' if turn > 1 else ''}!")
        elif self.finished:
            lines.append(f"Out of turns. The word was {secret.upper()}.")
        else:
            lines.append(f"{MAX_TURNS - turn} turn{'s' if MAX_TURNS - turn > 1 else ''} left.")
        return ToolOutput(
            blocks=[TextBlock(text="\n".join(lines))],
            metadata={"feedback": feedback, "turn": turn, "turns_left": MAX_TURNS - turn},
            reward=1.0 if solved else 0.0,
            finished=self.finished,
        )


if __name__ == "__main__":
    from ors import Server

    Server([Wordle]).run(port=int(os.environ.get("PORT", "8080")))
