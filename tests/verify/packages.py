"""The environment the verification tests publish, in versions whose reward logic differs (or not),
and the helpers that publish it through a real gateway and run episodes with the unmodified client."""

from __future__ import annotations

import io
import json
import textwrap
import zipfile

import httpx

GRADER = textwrap.dedent('''
    from ors import Environment, Split, TextBlock, ToolOutput, tool
    from pydantic import BaseModel

    MARK = "{mark}"


    class Answer(BaseModel):
        answer: str


    class Grader(Environment):
        @classmethod
        def list_splits(cls):
            return [Split(name="train", type="train")]

        @classmethod
        def list_tasks(cls, split):
            return [{{"id": i, "question": f"7 times {{i}}?", "answer": str(7 * i), "group": "ab"[i % 2]}}
                    for i in range(6)]

        def get_prompt(self):
            return [TextBlock(text=self.task_spec["question"])]

        @tool
        def hint(self) -> ToolOutput:
            """A hint; no reward."""
            return ToolOutput(blocks=[TextBlock(text="multiply")], reward=0.0, finished=False)

        @tool
        def submit(self, params: Answer) -> ToolOutput:
            """Answer; 1 when right."""
            right = params.answer == self.task_spec["answer"]
            reward = {reward}
            return ToolOutput(blocks=[TextBlock(text=MARK)], reward=reward, finished=True)
''')
SAME = "1.0 if right else 0.0"
# The reward logic changed for the tasks of group "b" (indexes 1, 3, 5) only.
HALF_FOR_B = '(0.5 if self.task_spec["group"] == "b" else 1.0) if right else 0.0'


def grader_zip(*, mark: str, reward: str = SAME, manifest: str = "", solutions: list | None = None,
               solutions_text: str | None = None) -> bytes:
    files = {"env.py": GRADER.format(mark=mark, reward=reward),
             "manifest.toml": 'name = "grader"\nentrypoint = "env:Grader"\n' + manifest}
    if solutions is not None:
        files["verify/solutions.jsonl"] = "".join(json.dumps(s) + "\n" for s in solutions)
    if solutions_text is not None:
        files["verify/solutions.jsonl"] = solutions_text
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, content in files.items():
            zf.writestr(name, content)
    return buf.getvalue()


def publish(base: str, person, content: bytes, slug: str = "grader") -> httpx.Response:
    return httpx.post(f"{base}/api/v1/environments/{person.team.slug}/{slug}/versions", headers=person.headers,
                      files={"package": (f"{slug}.zip", content)}, timeout=120)


def right_answer(index: int) -> str:
    return str(7 * index)
