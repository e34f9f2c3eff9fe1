"""The "vault" environment of the hidden-fields and sealed-split tests: tasks computed in code
(list_tasks), each with an answer that must never leave the platform, a manifest that hides the
answer and seals the test split. Every answer is a distinctive token, so a response body can be
searched for them byte by byte. The test split's tasks (sealed) carry a visible field of their own,
`ward`, that neither the prompt nor a tool quotes: the canary of a sealed spec."""

from __future__ import annotations

import textwrap

from tests.catalog.support import api, publish, zip_bytes

VAULT_ENV = textwrap.dedent('''
    from ors import Environment, Split, TextBlock, ToolOutput, tool
    from pydantic import BaseModel


    class Guess(BaseModel):
        answer: str


    class Vault(Environment):
        @classmethod
        def list_splits(cls):
            return [Split(name="train", type="train"), Split(name="test", type="test")]

        @classmethod
        def list_tasks(cls, split):
            return [{"id": f"{split}-{i}", "question": f"Open vault {split} {i}",
                     "answer": f"SECRET{split.upper()}{i:03d}XQ",
                     **({"ward": f"WARDSEALED{i:03d}ZQ"} if split == "test" else {})} for i in range(6)]

        def get_prompt(self):
            # The code sees the whole task: the prompt proves the answer reached it (by its length).
            return [TextBlock(text=f"{self.task_spec['question']} (code length {len(self.task_spec['answer'])})")]

        @tool
        def submit(self, params: Guess) -> ToolOutput:
            """Say the code."""
            ok = params.answer == self.task_spec["answer"]
            return ToolOutput(blocks=[TextBlock(text="Correct." if ok else "Wrong.")], reward=float(ok), finished=True)
''')

VAULT_MANIFEST = ('name = "vault"\ndescription = "Hidden answers, a sealed test split."\nentrypoint = "env:Vault"\n'
                  'visibility = "public"\nhidden_task_fields = ["answer"]\nsealed_splits = ["test"]\n')


# "sums": tasks of numbers only, whose one text-like value is the hidden answer (a task listed by its
# compact JSON, as the analytics list one without a prose field, must drop it).
SUMS_ENV = textwrap.dedent('''
    from ors import Environment, Split, TextBlock, ToolOutput, tool
    from pydantic import BaseModel


    class Guess(BaseModel):
        answer: str


    class Sums(Environment):
        @classmethod
        def list_splits(cls):
            return [Split(name="train", type="train")]

        @classmethod
        def list_tasks(cls, split):
            return [{"a": i, "b": 7, "answer": f"SECRETSUM{i:03d}XQ"} for i in range(6)]

        def get_prompt(self):
            return [TextBlock(text=f"{self.task_spec['a']} + {self.task_spec['b']}")]

        @tool
        def submit(self, params: Guess) -> ToolOutput:
            """Say the code."""
            ok = params.answer == self.task_spec["answer"]
            return ToolOutput(blocks=[TextBlock(text="Correct." if ok else "Wrong.")], reward=float(ok), finished=True)
''')

SUMS_MANIFEST = ('name = "sums"\ndescription = "Numbers and a hidden answer."\nentrypoint = "env:Sums"\n'
                 'visibility = "public"\nhidden_task_fields = ["answer"]\n')


def answer(split: str, index: int) -> str:
    return f"SECRET{split.upper()}{index:03d}XQ"


ANSWERS = [answer(split, i).encode() for split in ("train", "test") for i in range(6)]


def leaked(body: bytes | str) -> list[bytes]:
    """The hidden values a response body carries (the byte-for-byte search)."""
    data = body.encode() if isinstance(body, str) else body
    found = [a for a in ANSWERS if a in data]
    return found + ([b"SECRET"] if b"SECRET" in data and not found else [])


def ward(index: int) -> str:
    """The sealed canary of test task `index` (a visible field: only the sealing withholds it)."""
    return f"WARDSEALED{index:03d}ZQ"


def sealed_leaked(body: bytes | str) -> list[bytes]:
    """The sealed specs' canaries a response body carries (the byte-for-byte search)."""
    data = body.encode() if isinstance(body, str) else body
    found = [w for w in (ward(i).encode() for i in range(6)) if w in data]
    return found + ([b"WARDSEALED"] if b"WARDSEALED" in data and not found else [])


def body_of(response) -> bytes:
    """A Django test response's bytes, streamed ones (exports) included."""
    if getattr(response, "streaming", False):
        return b"".join(response.streaming_content)
    return response.content


def publish_vault(owner) -> dict:
    response = publish(owner, "vault", "vault.zip", zip_bytes({"env.py": VAULT_ENV, "manifest.toml": VAULT_MANIFEST}))
    assert response.status_code == 201, response.content
    return response.json()


def publish_sums(owner) -> dict:
    response = publish(owner, "sums", "sums.zip", zip_bytes({"env.py": SUMS_ENV, "manifest.toml": SUMS_MANIFEST}))
    assert response.status_code == 201, response.content
    return response.json()


def set_split(person, split: str, **body):
    return api(person).patch(f"/api/v1/environments/acme/vault/splits/{split}", body, content_type="application/json")
