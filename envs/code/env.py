"""Write a Python function; it is run against the task's assert-style tests."""

import functools
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from secrets import token_hex

from ors import Environment, JSONObject, Split, TextBlock, ToolOutput, tool
from pydantic import BaseModel, Field

HERE = Path(__file__).parent
HARNESS = HERE / "harness.py"
TASK_FILES = {"train": HERE / "tasks" / "train.jsonl", "test": HERE / "tasks" / "test.jsonl"}

DEFAULT_TIMEOUT_SECONDS = 10.0
MIN_TIMEOUT_SECONDS = 1.0
MAX_TIMEOUT_SECONDS = 60.0
MAX_OUTPUT_CHARS = 4000
MAX_FAILURES_SHOWN = 10


@functools.cache
def _load_tasks(split: str) -> tuple[JSONObject, ...]:
    lines = TASK_FILES[split].read_text(encoding="utf-8").splitlines()
    return tuple(json.loads(line) for line in lines if line.strip())


def _child_env(home: str) -> dict[str, str]:
    # Built from scratch so nothing from the platform process (DATABASE_URL, SECRET_KEY, ...) leaks in.
    return {"PATH": "/usr/bin:/bin", "HOME": home, "LANG": "C.UTF-8"}


def _read_capped(path: Path, limit: int = MAX_OUTPUT_CHARS) -> str:
    size = path.stat().st_size
    with path.open("rb") as f:
        text = f.read(limit * 4).decode("utf-8", errors="replace")
    if len(text) > limit or size > limit * 4:
        return text[:limit] + f"\n... [truncated, {size} bytes in total]"
    return text


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _format_seconds(seconds: float) -> str:
    return f"{seconds:g}"


@dataclass
class RunOutcome:
    total: int
    passed: int = 0
    timed_out: bool = False
    error: str | None = None
    failures: list[tuple[str, str]] = field(default_factory=list)
    stdout: str = ""
    stderr: str = ""


class CodeParams(BaseModel):
    code: str = Field(description="Python source defining the requested function.")


class Code(Environment):
    def __init__(self, task_spec: JSONObject | None = None, secrets: Mapping[str, str] | None = None) -> None:
        super().__init__(task_spec or {}, secrets or {})
        self._secrets: dict[str, str] = dict(secrets or {})

    @classmethod
    def list_splits(cls) -> list[Split]:
        return [Split(name="train", type="train"), Split(name="test", type="test")]

    @classmethod
    def list_tasks(cls, split: str) -> list[JSONObject]:
        if split not in TASK_FILES:
            raise ValueError(f"unknown split {split!r}; expected one of {sorted(TASK_FILES)}")
        return list(_load_tasks(split))

    @property
    def tests(self) -> list[str]:
        tests = self.task_spec.get("tests")
        if not isinstance(tests, list) or not tests or not all(isinstance(t, str) for t in tests):
            raise ValueError("task_spec['tests'] must be a non-empty list of strings")
        return tests

    @property
    def timeout_seconds(self) -> float:
        value = self.task_spec.get("timeout_seconds")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return DEFAULT_TIMEOUT_SECONDS
        return min(max(float(value), MIN_TIMEOUT_SECONDS), MAX_TIMEOUT_SECONDS)

    def get_prompt(self) -> list[TextBlock]:
        entry = self.task_spec.get("entry")
        define = f"Define `{entry}` at the top level of your code. " if entry else ""
        return [
            TextBlock(
                text=(
                    f"{self.task_spec['prompt']}\n\n{define}"
                    "Call `run` with your code to check it against the task's tests, as often as you like. "
                    "Call `submit` with your final code to finish."
                )
            )
        ]

    def _execute(self, code: str) -> RunOutcome:
        tests = self.tests
        limit = self.timeout_seconds
        outcome = RunOutcome(total=len(tests))
        with tempfile.TemporaryDirectory(prefix="ors-code-", ignore_cleanup_errors=True) as tmp:
            workdir = Path(tmp)
            (workdir / "solution.py").write_text(code, encoding="utf-8", errors="replace")
            (workdir / "tests.json").write_text(json.dumps(tests), encoding="utf-8")
            shutil.copyfile(HARNESS, workdir / "harness.py")
            # An unguessable name, so the solution cannot easily pre-write a fake result.
            result_path = workdir / f"result-{token_hex(16)}.json"
            stdout_path, stderr_path = workdir / "stdout.txt", workdir / "stderr.txt"

            # Output goes to files, not pipes, so a chatty solution cannot exhaust our memory and a
            # background grandchild holding a pipe open cannot block us. The child gets its own
            # process group so the whole tree can be killed on timeout.
            with stdout_path.open("wb") as out, stderr_path.open("wb") as err:
                proc = subprocess.Popen(
                    [sys.executable, "-I", str(workdir / "harness.py")],
                    stdin=subprocess.PIPE,
                    stdout=out,
                    stderr=err,
                    cwd=workdir,
                    env=_child_env(tmp),
                    start_new_session=True,
                )
                try:
                    proc.communicate(input=f"{result_path}\n".encode(), timeout=limit)
                except subprocess.TimeoutExpired:
                    outcome.timed_out = True
                finally:
                    _kill_group(proc.pid)
                    proc.wait()

            outcome.stdout, outcome.stderr = _read_capped(stdout_path), _read_capped(stderr_path)
            if outcome.timed_out:
                return outcome
            if not result_path.exists():
                outcome.error = (
                    f"the test harness exited with code {proc.returncode} before reporting results"
                )
                return outcome
            report = json.loads(result_path.read_text(encoding="utf-8"))

        outcome.passed = sum(1 for r in report["results"] if r["passed"])
        outcome.failures = [(r["test"], r["error"]) for r in report["results"] if not r["passed"]]
        if report["load_error"]:
            outcome.error = f"Your code raised an error while loading:\n{report['load_error']}"
        return outcome

    def _evaluate(self, code: str, final: bool) -> ToolOutput:
        outcome = self._execute(code)
        lines: list[str] = []
        if outcome.timed_out:
            lines.append(f"timed out after {_format_seconds(self.timeout_seconds)} s")
        else:
            lines.append(
                f"Passed {outcome.passed}/{outcome.total} tests; failed {outcome.total - outcome.passed}."
            )
            if outcome.error:
                lines.append(outcome.error)
            else:
                for test, error in outcome.failures[:MAX_FAILURES_SHOWN]:
                    lines.append(f"FAILED: {test}\n  {error}")
                if len(outcome.failures) > MAX_FAILURES_SHOWN:
                    lines.append(f"... and {len(outcome.failures) - MAX_FAILURES_SHOWN} more failures")
        if outcome.stdout:
            lines.append(f"--- stdout ---\n{outcome.stdout}")
        if outcome.stderr:
            lines.append(f"--- stderr ---\n{outcome.stderr}")

        all_passed = not outcome.timed_out and outcome.passed == outcome.total
        reward = 0.0 if outcome.timed_out else outcome.passed / outcome.total
        return ToolOutput(
            blocks=[TextBlock(text="\n".join(lines))],
            metadata={"passed": outcome.passed, "total": outcome.total, "timed_out": outcome.timed_out},
            reward=reward,
            finished=final or all_passed,
        )

    # Sync on purpose: the call blocks on a subprocess, and the platform runs sync tools in a thread pool.
    @tool
    def run(self, params: CodeParams) -> ToolOutput:
        """Run your solution against the task's tests. Finishes the episode once every test passes."""
        return self._evaluate(params.code, final=False)

    @tool
    def submit(self, params: CodeParams) -> ToolOutput:
        """Submit your final solution: it is run against the task's tests and the episode ends."""
        return self._evaluate(params.code, final=True)


if __name__ == "__main__":
    from ors import Server

    Server([Code]).run(port=int(os.environ.get("PORT", "8080")))
