"""The sandbox worker checks whether a method is a tool (the ORS SDK's signature and type-hint
checks) once per function, not at every call, and answers as the SDK does."""

from __future__ import annotations

from ors import Environment, TextBlock, ToolOutput, tool
from pydantic import BaseModel

from orsplatform.sandbox.worker_host import Host


class GuessInput(BaseModel):
    word: str


class Game(Environment):
    @tool
    def guess(self, params: GuessInput) -> ToolOutput:
        return ToolOutput(blocks=[TextBlock(text=params.word)], reward=0.0, finished=False)

    @tool
    def give_up(self) -> ToolOutput:
        return ToolOutput(blocks=[], reward=0.0, finished=True)

    def helper(self) -> int:
        return 1

    # The rest of an environment (abstract in the SDK), unused here.
    def get_prompt(self):
        return []

    @classmethod
    def list_splits(cls):
        return []

    @classmethod
    def list_tasks(cls, split):
        return []


def host_counting_checks() -> tuple[Host, list]:
    seen: list = []

    class Counting(Environment):
        @staticmethod
        def _is_tool(fn):
            seen.append(fn.__name__)
            return Environment._is_tool(fn)

    host = Host.__new__(Host)  # the tool checks alone: no package, no thread pool
    host.Environment, host._tools = Counting, {}
    return host, seen


def test_a_tools_checks_run_once_for_every_instance_and_call():
    host, seen = host_counting_checks()
    first, second = object.__new__(Game), object.__new__(Game)
    for instance in (first, second, first):
        assert host._tool(instance.guess) == (True, GuessInput)
        assert host._tool(instance.give_up) == (True, None)
        assert host._tool(instance.helper) == (False, None)
    assert sorted(seen) == ["give_up", "guess", "helper"]


def test_the_answers_are_the_sdks_own():
    host, _ = host_counting_checks()
    game = object.__new__(Game)
    for name in ("guess", "give_up", "helper"):
        fn = getattr(game, name)
        assert host._tool(fn)[0] is Environment._is_tool(fn)


def test_a_function_made_for_one_instance_is_checked_as_itself():
    host, seen = host_counting_checks()
    game = object.__new__(Game)
    game.guess = lambda params: None  # an attribute shadowing the tool: not a tool
    assert host._tool(game.guess) == (False, None)
    assert host._tool(object.__new__(Game).guess) == (True, GuessInput)
    assert seen == ["<lambda>", "guess"]
