"""Exercise the bundled ORS environments directly, without a server."""

import asyncio
import base64
import importlib.util
import inspect
import struct
import time
import tomllib
import zlib
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from ors import Environment, ToolOutput

ENVS_DIR = Path(__file__).resolve().parents[2] / "envs"
TESTS_DIR = Path(__file__).resolve().parent
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _load_module(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def math_mod() -> ModuleType:
    return _load_module(ENVS_DIR / "math" / "env.py", "bundled_env_math")


@pytest.fixture(scope="module")
def wordle_mod() -> ModuleType:
    return _load_module(ENVS_DIR / "wordle" / "env.py", "bundled_env_wordle")


@pytest.fixture(scope="module")
def vision_mod() -> ModuleType:
    return _load_module(ENVS_DIR / "vision" / "env.py", "bundled_env_vision")


@pytest.fixture(scope="module")
def code_mod() -> ModuleType:
    return _load_module(ENVS_DIR / "code" / "env.py", "bundled_env_code")


def call(env: Environment, name: str, **tool_input: Any) -> ToolOutput:
    result = asyncio.run(env._call_tool(name, tool_input)).root
    assert result.ok, getattr(result, "error", None)
    return result.output


def text_of(output: ToolOutput) -> str:
    return "\n".join(block.text for block in output.blocks if block.type == "text")


def decode_png(data: bytes) -> tuple[int, int, set[tuple[int, int, int]]]:
    """Return (width, height, distinct RGB colours) of an 8-bit RGB PNG without filtering."""
    assert data[:8] == PNG_SIGNATURE
    pos, idat, width, height = 8, b"", 0, 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        tag, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        assert crc == zlib.crc32(tag + body)
        if tag == b"IHDR":
            width, height, depth, colour_type = struct.unpack(">IIBB", body[:10])
            assert (depth, colour_type) == (8, 2)
        elif tag == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = 1 + 3 * width
    assert len(raw) == stride * height
    colours = set()
    for row in range(height):
        line = raw[row * stride : (row + 1) * stride]
        assert line[0] == 0
        colours.update(tuple(line[i : i + 3]) for i in range(1, stride, 3))
    return width, height, colours


# --- all environments -------------------------------------------------------


@pytest.mark.parametrize(
    "folder,class_name", [("math", "Math"), ("wordle", "Wordle"), ("vision", "Vision"), ("code", "Code")]
)
def test_each_environment_folder_has_a_manifest_pointing_at_its_class(folder: str, class_name: str) -> None:
    manifest = tomllib.loads((ENVS_DIR / folder / "manifest.toml").read_text())
    assert manifest["name"] == folder
    assert manifest["entrypoint"] == f"env:{class_name}"
    assert manifest["visibility"] == "public"
    assert manifest["tool_timeout_seconds"] > 0
    assert manifest["required_secrets"] == []
    assert (ENVS_DIR / folder / "README.md").is_file()

    module = _load_module(ENVS_DIR / folder / "env.py", f"bundled_manifest_check_{folder}")
    cls = getattr(module, class_name)
    assert issubclass(cls, Environment)
    assert cls.name().lower() == folder
    assert cls.list_tools().tools


# --- math -------------------------------------------------------------------


def test_math_has_a_train_and_a_test_split(math_mod: ModuleType) -> None:
    splits = math_mod.Math.list_splits()
    assert [(s.name, s.type) for s in splits] == [("train", "train"), ("test", "test")]


def test_math_has_ten_thousand_train_tasks_and_one_thousand_test_tasks(math_mod: ModuleType) -> None:
    Math = math_mod.Math
    assert asyncio.run(Math.num_tasks("train")) == 10_000
    assert asyncio.run(Math.num_tasks("test")) == 1_000
    assert len(Math.list_tasks("train")) == 10_000
    assert len(Math.list_tasks("test")) == 1_000


def test_math_get_task_computes_the_same_task_as_list_tasks(math_mod: ModuleType) -> None:
    Math = math_mod.Math
    tasks = Math.list_tasks("train")
    for index in (0, 1, 17, 4321, 9999):
        task = asyncio.run(Math.get_task("train", index))
        assert task == tasks[index]
        assert task["id"] == f"train-{index}"
    assert asyncio.run(Math.get_task("test", 5)) == Math.list_tasks("test")[5]


def test_math_get_task_raises_index_error_past_the_end(math_mod: ModuleType) -> None:
    with pytest.raises(IndexError):
        asyncio.run(math_mod.Math.get_task("train", 10_000))
    with pytest.raises(IndexError):
        asyncio.run(math_mod.Math.get_task("test", 1_000))


def test_math_every_answer_is_a_non_negative_integer(math_mod: ModuleType) -> None:
    for split in ("train", "test"):
        for task in math_mod.Math.list_tasks(split):
            assert task["answer"].isdigit(), task


def test_math_prompt_shows_the_question_and_asks_for_submit(math_mod: ModuleType) -> None:
    task = asyncio.run(math_mod.Math.get_task("train", 3))
    [block] = math_mod.Math(task).get_prompt()
    assert task["question"] in block.text
    assert "submit" in block.text


@pytest.mark.parametrize("form", ["{}", "{}.0", " {} ", "{}.000"])
def test_math_submit_accepts_the_answer_in_any_numeric_form(math_mod: ModuleType, form: str) -> None:
    task = asyncio.run(math_mod.Math.get_task("train", 42))
    output = call(math_mod.Math(task), "submit", answer=form.format(task["answer"]))
    assert output.reward == 1.0
    assert output.finished is True


@pytest.mark.parametrize("wrong", ["wrong", "", "nan", "1e999999"])
def test_math_submit_gives_zero_for_a_wrong_answer_and_still_finishes(
    math_mod: ModuleType, wrong: str
) -> None:
    task = asyncio.run(math_mod.Math.get_task("train", 42))
    output = call(math_mod.Math(task), "submit", answer=wrong)
    assert output.reward == 0.0
    assert output.finished is True

    off_by_one = call(math_mod.Math(task), "submit", answer=str(int(task["answer"]) + 1))
    assert off_by_one.reward == 0.0


def test_math_submit_reports_secret_names_but_never_values(math_mod: ModuleType) -> None:
    task = asyncio.run(math_mod.Math.get_task("test", 0))
    env = math_mod.Math(task, {"canary": "tweet-tweet-value", "other": "x"})
    output = call(env, "submit", answer=task["answer"])
    assert output.metadata["secrets_seen"] == ["canary", "other"]
    assert "tweet-tweet-value" not in output.model_dump_json()

    without = call(math_mod.Math(task), "submit", answer=task["answer"])
    assert without.metadata["secrets_seen"] == []


# --- wordle -----------------------------------------------------------------


def wordle_for(wordle_mod: ModuleType, secret: str) -> Environment:
    return wordle_mod.Wordle({"id": "t", "secret_word": secret})


def test_wordle_ships_at_least_three_hundred_words_split_into_disjoint_train_and_test(
    wordle_mod: ModuleType,
) -> None:
    train = [t["secret_word"] for t in wordle_mod.Wordle.list_tasks("train")]
    test = [t["secret_word"] for t in wordle_mod.Wordle.list_tasks("test")]
    assert len(train) + len(test) >= 300
    assert test and not set(train) & set(test)
    assert len(set(train)) == len(train)
    assert all(len(w) == 5 and w.isascii() and w.isalpha() and w.islower() for w in train + test)
    assert wordle_mod.Wordle.list_tasks("test") == wordle_mod.Wordle.list_tasks("test")


def test_wordle_prompt_does_not_reveal_the_secret_word(wordle_mod: ModuleType) -> None:
    # The prompt is identical for every task, so it cannot carry the secret word.
    prompts = {
        tuple(block.text for block in wordle_mod.Wordle(task).get_prompt())
        for task in wordle_mod.Wordle.list_tasks("train") + wordle_mod.Wordle.list_tasks("test")
    }
    assert len(prompts) == 1


@pytest.mark.parametrize(
    "secret,guess,expected",
    [
        ("crane", "crane", "GGGGG"),
        ("crane", "plumb", "_____"),
        ("apple", "ppppp", "_GG__"),
        ("abbey", "bobby", "Y_G_G"),
        ("speed", "geese", "_YGY_"),
        ("eerie", "never", "_G_YY"),
        ("spoon", "books", "_YG_Y"),
    ],
)
def test_wordle_feedback_handles_duplicate_letters(
    wordle_mod: ModuleType, secret: str, guess: str, expected: str
) -> None:
    assert wordle_mod.score_guess(guess, secret) == expected


def test_wordle_guess_tool_returns_feedback_without_reward_until_the_end(wordle_mod: ModuleType) -> None:
    output = call(wordle_for(wordle_mod, "speed"), "guess", word="geese")
    assert "_YGY_" in text_of(output)
    assert output.metadata["feedback"] == "_YGY_"
    assert output.reward == 0.0
    assert output.finished is False


def test_wordle_solving_gives_reward_one_and_finishes(wordle_mod: ModuleType) -> None:
    env = wordle_for(wordle_mod, "crane")
    assert call(env, "guess", word="slate").finished is False
    output = call(env, "guess", word=" CRANE ")
    assert output.reward == 1.0
    assert output.finished is True
    assert "GGGGG" in text_of(output)


def test_wordle_ends_after_six_wrong_guesses(wordle_mod: ModuleType) -> None:
    env = wordle_for(wordle_mod, "crane")
    outputs = [call(env, "guess", word=w) for w in ["plumb", "fight", "dozen", "crank", "crate", "craze"]]
    assert [o.finished for o in outputs] == [False] * 5 + [True]
    assert [o.reward for o in outputs] == [0.0] * 6
    assert "CRANE" in text_of(outputs[-1])


def test_wordle_guess_after_the_game_is_over_is_refused(wordle_mod: ModuleType) -> None:
    env = wordle_for(wordle_mod, "crane")
    call(env, "guess", word="crane")
    output = call(env, "guess", word="crane")
    assert "over" in text_of(output)
    assert output.reward == 0.0
    assert output.finished is True


@pytest.mark.parametrize("bad", ["cran", "cranes", "cr4ne", "cr ne", "crañe", ""])
def test_wordle_invalid_guess_is_explained_and_does_not_use_a_turn(wordle_mod: ModuleType, bad: str) -> None:
    env = wordle_for(wordle_mod, "crane")
    invalid = call(env, "guess", word=bad)
    assert "Invalid" in text_of(invalid)
    assert invalid.reward == 0.0
    assert invalid.finished is False
    outputs = [call(env, "guess", word="plumb") for _ in range(6)]
    assert [o.finished for o in outputs] == [False] * 5 + [True]


# --- vision -----------------------------------------------------------------


def test_vision_has_enough_deterministic_tasks(vision_mod: ModuleType) -> None:
    Vision = vision_mod.Vision
    train, test = Vision.list_tasks("train"), Vision.list_tasks("test")
    assert len(train) >= 200 and len(test) >= 50
    assert train == Vision.list_tasks("train")
    assert {t["colour"] for t in train} == set(vision_mod.PALETTE)


def test_vision_prompt_contains_a_png_showing_the_square_in_the_answer_colour(vision_mod: ModuleType) -> None:
    for task in vision_mod.Vision.list_tasks("test")[:10]:
        text, image = vision_mod.Vision(task).get_prompt()
        assert text.type == "text" and "colour" in text.text
        assert image.type == "image" and image.mimeType == "image/png"
        png = base64.b64decode(image.data)
        assert png[:8] == PNG_SIGNATURE
        width, height, colours = decode_png(png)
        assert (width, height) == (32, 32)
        assert colours == {vision_mod.BACKGROUND, vision_mod.PALETTE[task["colour"]]}


def test_vision_shared_tools_are_only_answer(vision_mod: ModuleType) -> None:
    assert [t.name for t in vision_mod.Vision.list_tools().tools] == ["answer"]


def test_vision_task_tools_vary_with_the_task(vision_mod: ModuleType) -> None:
    Vision = vision_mod.Vision
    seen: dict[tuple[bool, bool], list[str]] = {}
    for task in Vision.list_tasks("train"):
        names = [t.name for t in Vision(task).list_task_tools().tools]
        seen[(bool(task.get("zoomable")), "hint" in task)] = names
    assert seen == {
        (False, False): [],
        (True, False): ["zoom"],
        (False, True): ["hint"],
        (True, True): ["hint", "zoom"],
    }


def test_vision_task_tool_specs_carry_description_and_schema(vision_mod: ModuleType) -> None:
    env = vision_mod.Vision(
        {"colour": "red", "square": {"x": 0, "y": 0, "size": 8}, "zoomable": True, "hint": "h"}
    )
    specs = {t.name: t for t in env.list_task_tools().tools}
    assert specs["zoom"].input_schema == vision_mod.ZoomParams.model_json_schema()
    assert specs["zoom"].description == vision_mod.Vision.zoom.__doc__.strip()
    assert specs["hint"].input_schema is None
    assert specs["hint"].description


def test_vision_unavailable_task_tool_says_so_without_reward(vision_mod: ModuleType) -> None:
    env = vision_mod.Vision({"colour": "red", "square": {"x": 0, "y": 0, "size": 8}})
    for name, tool_input in (("zoom", {"factor": 2}), ("hint", {})):
        output = call(env, name, **tool_input)
        assert text_of(output) == "tool not available for this task"
        assert output.reward == 0.0
        assert output.finished is False


def test_vision_zoom_returns_a_magnified_png(vision_mod: ModuleType) -> None:
    env = vision_mod.Vision({"colour": "blue", "square": {"x": 4, "y": 4, "size": 8}, "zoomable": True})
    output = call(env, "zoom", factor=3)
    image = next(block for block in output.blocks if block.type == "image")
    width, height, colours = decode_png(base64.b64decode(image.data))
    assert (width, height) == (96, 96)
    assert vision_mod.PALETTE["blue"] in colours
    assert output.finished is False


def test_vision_zoom_rejects_an_out_of_range_factor(vision_mod: ModuleType) -> None:
    env = vision_mod.Vision({"colour": "blue", "square": {"x": 4, "y": 4, "size": 8}, "zoomable": True})
    result = asyncio.run(env._call_tool("zoom", {"factor": 100})).root
    assert result.ok is False


def test_vision_hint_returns_the_task_hint(vision_mod: ModuleType) -> None:
    env = vision_mod.Vision(
        {"colour": "blue", "square": {"x": 4, "y": 4, "size": 8}, "hint": "Think of the sky."}
    )
    assert text_of(call(env, "hint")) == "Think of the sky."


def test_vision_answer_rewards_the_right_colour_and_finishes(vision_mod: ModuleType) -> None:
    task = vision_mod.Vision.list_tasks("test")[0]
    right = call(vision_mod.Vision(task), "answer", colour=f" {task['colour'].upper()} ")
    assert (right.reward, right.finished) == (1.0, True)
    wrong_colour = next(c for c in vision_mod.PALETTE if c != task["colour"])
    wrong = call(vision_mod.Vision(task), "answer", colour=wrong_colour)
    assert (wrong.reward, wrong.finished) == (0.0, True)


# --- code -------------------------------------------------------------------


ADD_TASK = {
    "id": "add-test",
    "prompt": "Write a function `add(a, b)`.",
    "entry": "add",
    "tests": [
        "assert add(1, 2) == 3",
        "assert add(0, 0) == 0",
        "assert add(-1, 1) == 0",
        "assert add(2, 2) == 4",
    ],
}


def test_code_task_files_hold_enough_well_formed_tasks(code_mod: ModuleType) -> None:
    train, test = code_mod.Code.list_tasks("train"), code_mod.Code.list_tasks("test")
    assert len(train) >= 20 and len(test) >= 10
    ids = [t["id"] for t in train + test]
    assert len(ids) == len(set(ids))
    for task in train + test:
        assert f"`{task['entry']}(" in task["prompt"]
        assert task["tests"] and all(t.startswith("assert ") for t in task["tests"])


def test_code_reference_solutions_pass_every_bundled_task(code_mod: ModuleType) -> None:
    solutions = _load_module(TESTS_DIR / "code_reference_solutions.py", "bundled_code_solutions").SOLUTIONS
    tasks = code_mod.Code.list_tasks("train") + code_mod.Code.list_tasks("test")
    assert set(solutions) == {t["id"] for t in tasks}
    for task in tasks:
        output = call(code_mod.Code(task), "run", code=solutions[task["id"]])
        assert (output.reward, output.finished) == (1.0, True), (task["id"], text_of(output))


def test_code_run_counts_each_test_separately(code_mod: ModuleType) -> None:
    # Right only when a == b, so exactly add(0, 0) and add(2, 2) pass.
    output = call(code_mod.Code(ADD_TASK), "run", code="def add(a, b):\n    return a * 2\n")
    assert output.reward == 0.5
    assert output.finished is False
    assert output.metadata == {"passed": 2, "total": 4, "timed_out": False}
    assert "Passed 2/4" in text_of(output)
    assert "FAILED: assert add(1, 2) == 3" in text_of(output)


def test_code_submit_always_finishes(code_mod: ModuleType) -> None:
    wrong = call(code_mod.Code(ADD_TASK), "submit", code="def add(a, b):\n    return 0\n")
    assert (wrong.reward, wrong.finished) == (0.5, True)
    right = call(code_mod.Code(ADD_TASK), "submit", code="def add(a, b):\n    return a + b\n")
    assert (right.reward, right.finished) == (1.0, True)


def test_code_solution_that_fails_to_load_scores_zero(code_mod: ModuleType) -> None:
    output = call(code_mod.Code(ADD_TASK), "run", code="def add(a, b:\n    pass\n")
    assert output.reward == 0.0
    assert output.finished is False
    assert "SyntaxError" in text_of(output)


def test_code_run_times_out_with_zero_reward(code_mod: ModuleType) -> None:
    env = code_mod.Code({**ADD_TASK, "timeout_seconds": 1})
    started = time.monotonic()
    output = call(env, "run", code="import time; time.sleep(5)")
    assert time.monotonic() - started < 4
    assert output.reward == 0.0
    assert output.finished is False
    assert "timed out after 1 s" in text_of(output)
    assert output.metadata["timed_out"] is True


def test_code_child_process_does_not_inherit_the_platform_environment(
    code_mod: ModuleType,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgres://user:pw@db/prod")
    monkeypatch.setenv("SECRET_KEY", "django-insecure-abc")
    monkeypatch.setenv("DJANGO_SETTINGS_MODULE", "platform.settings")
    code = "import os\nprint('KEYS', sorted(os.environ))\nprint('VALUES', list(os.environ.values()))\n"
    text = text_of(call(code_mod.Code(ADD_TASK), "run", code=code))
    assert "KEYS ['HOME', 'LANG', 'PATH']" in text
    for leaked in ("DATABASE_URL", "SECRET_KEY", "DJANGO_SETTINGS_MODULE", "postgres://", "django-insecure"):
        assert leaked not in text


def test_code_output_is_truncated_to_four_thousand_characters(code_mod: ModuleType) -> None:
    code = "import sys\nprint('o' * 50_000)\nprint('e' * 50_000, file=sys.stderr)\n"
    text = text_of(call(code_mod.Code(ADD_TASK), "run", code=code))
    assert 8_000 <= len(text) < 9_000
    assert text.count("truncated") == 2


def test_code_printing_a_fake_result_does_not_earn_reward(code_mod: ModuleType) -> None:
    code = 'print(\'{"load_error": null, "results": [{"test": "x", "passed": true, "error": null}]}\')\n'
    assert call(code_mod.Code(ADD_TASK), "run", code=code).reward == 0.0


def test_code_run_and_submit_are_sync_tools(code_mod: ModuleType) -> None:
    assert not inspect.iscoroutinefunction(code_mod.Code.run)
    assert not inspect.iscoroutinefunction(code_mod.Code.submit)
    assert {t.name for t in code_mod.Code.list_tools().tools} == {"run", "submit"}


@pytest.mark.parametrize(
    "value,expected", [(None, 10.0), (1, 1.0), (0.1, 1.0), (30, 30.0), (1000, 60.0), ("5", 10.0)]
)
def test_code_wall_time_limit_comes_from_the_task_and_is_clamped(
    code_mod: ModuleType,
    value: object,
    expected: float,
) -> None:
    spec = dict(ADD_TASK) if value is None else {**ADD_TASK, "timeout_seconds": value}
    assert code_mod.Code(spec).timeout_seconds == expected
