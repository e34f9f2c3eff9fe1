"""An environment written against the openreward SDK (``openreward.environments``) publishes
unchanged through the REST API, the console and the command, and runs in the sandbox worker with
both official clients, over OpenEnv and on the celery executor. The same environment written
against ors-sdk gives the same tools, splits, wire answers and audit rows."""

from __future__ import annotations

import io

import httpx
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import call_command
from openenv.core.generic_client import GenericEnvClient
from openreward import OpenReward
from ors.client import ORS, ImageBlock, TextBlock

from orsplatform.catalog.models import Environment, Task
from orsplatform.episodes.models import Session, ToolCall
from tests.catalog.support import ADDER_OPENREWARD, ADDER_ORS, adder_solution, api, login, publish
from tests.e2e.conftest import openreward_at  # noqa: F401  (the fixture pointing the openreward client)
from tests.e2e.helpers import wait_for
from tests.fixtures.celery import wait_until
from tests.fixtures.ors import sse_result, start_episode


def publish_both(owner) -> tuple[dict, dict]:
    ors_version = publish(owner, "adder-ors", "adder.py", ADDER_ORS)
    openreward_version = publish(owner, "adder", "adder.py", ADDER_OPENREWARD)
    assert ors_version.status_code == 201, ors_version.json()
    assert openreward_version.status_code == 201, openreward_version.json()
    return ors_version.json(), openreward_version.json()


def test_the_rest_api_publishes_an_openreward_environment_with_the_same_tools_and_splits_as_its_ors_twin(owner):
    ors_body, body = publish_both(owner)
    assert body["entrypoint"] == "env:Adder" and body["validation"]["sdk"] == "openreward"
    assert ors_body["validation"]["sdk"] == "ors"
    assert body["tools"] == ors_body["tools"]
    assert [t["name"] for t in body["tools"]] == ["answer", "hint"]
    assert body["tools"][0]["description"] == "Answer with the sum."
    assert body["tools"][0]["input_schema"]["required"] == ["answer"]
    assert body["validation"]["prompt_checked"] is True
    splits = api(owner).get("/api/v1/environments/acme/adder/splits").json()
    assert [(s["name"], s["type"], s["num_tasks"]) for s in splits] == [("train", "train", 8), ("test", "test", 8)]
    specs = list(Task.objects.filter(split__environment__slug="adder", split__name="test")
                 .order_by("index").values_list("spec", flat=True))
    assert specs[1] == {"id": "test-1", "a": 101, "b": 2}


def test_the_console_publishes_an_openreward_environment(owner):
    client = login(owner)
    response = client.post("/console/acme/environments/publish",
                           {"package": SimpleUploadedFile("adder.py", ADDER_OPENREWARD.encode()), "slug": "adder"})
    assert response.status_code == 302
    page = client.get(response["Location"]).content.decode()
    assert "Published acme/adder@1: validation passed" in page and "openreward SDK" in page
    assert Environment.objects.get(slug="adder").current_version.tools[1]["name"] == "hint"


def test_the_command_publishes_an_openreward_environment(owner, tmp_path):
    path = tmp_path / "adder.py"
    path.write_text(ADDER_OPENREWARD)
    out = io.StringIO()
    call_command("publish_env", str(path), "--team", "acme", stdout=out)
    assert out.getvalue().strip() == "published acme/adder@1"


async def test_an_episode_answers_the_same_wire_whichever_sdk_the_environment_uses(client, owner):
    from tests.catalog.support import in_thread

    await in_thread(publish_both)(owner)
    answers = {}
    for env in ("acme/adder-ors", "acme/adder"):
        sid = await start_episode(client, owner.headers, env=env, split="test", index=3,
                                  secrets={"ADDER_KEY": "k-123456"})
        headers = {**owner.headers, "X-Session-ID": sid}
        prompt = (await client.get("/prompt", headers=headers)).json()
        hint = await client.post("/call", headers=headers, json={"name": "hint", "input": {}})
        bad = await client.post("/call", headers=headers, json={"name": "answer", "input": {"nope": 1}})
        unknown = await client.post("/call", headers=headers, json={"name": "nope", "input": {}})
        right = await client.post("/call", headers=headers, json={"name": "answer", "input": {"answer": "109"}})
        task_tools = (await client.get("/task_tools", headers=headers)).json()
        assert (await client.post("/delete", headers=headers)).status_code == 200
        answers[env] = (prompt, sse_result(hint.text), sse_result(bad.text), sse_result(unknown.text),
                        sse_result(right.text), task_tools)
    assert answers["acme/adder"] == answers["acme/adder-ors"]
    prompt, hint, bad, unknown, right, _ = answers["acme/adder"]
    assert prompt == [{"type": "text", "text": "What is 103 + 6?", "detail": None}]
    assert hint["output"]["blocks"][1]["mimeType"] == "image/png" and hint["output"]["metadata"] == {"keyed": True}
    assert bad["ok"] is False and bad["reason"] == "input_validation"
    assert unknown["ok"] is False and unknown["reason"] == "not_found"
    assert right["output"] == {"blocks": [{"type": "text", "text": "Correct.", "detail": None}],
                               "metadata": {"correct": True}, "reward": 1.0, "finished": True}

    def audit(slug: str) -> list[tuple]:
        rows = ToolCall.objects.filter(session__environment__slug=slug).order_by("started_at")
        return [(c.name, c.status, c.input, c.output, c.reward, c.finished, c.error) for c in rows]

    assert await in_thread(audit)("adder") == await in_thread(audit)("adder-ors")
    sessions = await in_thread(lambda: [(s.calls, s.total_reward, s.finished, s.status)
                                        for s in Session.objects.filter(team=owner.team)])()
    assert sessions == [(4, 1.0, True, Session.Status.DELETED)] * 2


def test_both_official_clients_play_an_openreward_environment_on_a_real_server(server, owner,
                                                                              openreward_at):  # noqa: F811
    publish(owner, "adder", "adder.py", ADDER_OPENREWARD)
    with ORS(base_url=server.url, api_key=owner.token) as client:
        env = client.environment("acme/adder")
        assert env.list_splits() == ["train", "test"]
        assert [t.name for t in env.list_tools()] == ["answer", "hint"]
        task = env.get_task("train", 5)
        with env.session(task=task, secrets={"ADDER_KEY": "secret-value"}) as session:
            assert session.get_prompt()[0].text == "What is 5 + 10?"
            hint = session.call_tool("hint", {})
            assert isinstance(hint.blocks[0], TextBlock) and isinstance(hint.blocks[1], ImageBlock)
            assert hint.metadata == {"keyed": True} and hint.finished is False
            out = session.call_tool("answer", {"answer": adder_solution(task.task_spec)})
            assert out.reward == 1.0 and out.finished is True and out.blocks[0].text == "Correct."
        with env.session(split="test", index=2) as session:
            assert session.call_tool("answer", {"answer": "-1"}).reward == 0.0

    openreward_at(server.url)
    client = OpenReward(api_key=owner.token)
    try:
        env = client.environments.get("acme/adder")
        task = env.get_task("test", 4)
        assert task.task_spec == {"id": "test-4", "a": 104, "b": 8}
        with env.session(task=task) as session:
            sid = session.sid
            assert session.get_prompt()[0].text == "What is 104 + 8?"
            assert [t.name for t in session.list_tools()] == ["answer", "hint"]
            out = session.call_tool("answer", {"answer": adder_solution(task.task_spec)})
            assert out.reward == 1.0 and out.finished is True
    finally:
        client.close()
    row = Session.objects.get(sid=sid)
    assert row.environment.full_name == "acme/adder" and row.total_reward == 1.0 and row.finished
    rewards = sorted(ToolCall.objects.filter(session__environment__slug="adder", name="answer")
                     .values_list("reward", flat=True))
    assert rewards == [0.0, 1.0, 1.0]


def test_an_openreward_environment_plays_over_openenv(server, owner):
    publish(owner, "adder", "adder.py", ADDER_OPENREWARD)
    url = f"{server.url}/openenv/acme/adder"
    with GenericEnvClient(base_url=url, headers=owner.headers).sync() as env:
        meta = env.reset(split="train", index=6).observation["metadata"]
        assert meta["prompt"][0]["text"] == "What is 6 + 12?"
        tools = env.step({"type": "list_tools"}).observation["tools"]
        assert [t["name"] for t in tools] == ["answer", "hint"]
        step = env.step({"type": "call_tool", "tool_name": "answer", "arguments": {"answer": "18"}})
        assert (step.reward, step.done) == (1.0, True)
    row = wait_for(lambda: Session.objects.filter(status=Session.Status.DELETED).first(), what="episode ended")
    assert row.protocol == Session.Protocol.OPENENV and row.total_reward == 1.0


@pytest.mark.e2e
def test_an_openreward_environment_runs_on_the_celery_executor(cluster, server_factory, owner):
    publish(owner, "adder", "adder.py", ADDER_OPENREWARD)
    cluster.start_runner()
    gateway = server_factory(**cluster.env())
    headers = owner.headers
    sid = httpx.post(f"{gateway.url}/create_session", headers=headers).json()["sid"]
    headers = {**headers, "X-Session-ID": sid}
    r = httpx.post(f"{gateway.url}/acme/adder/create", headers=headers, json={"split": "test", "index": 0},
                   timeout=60)
    assert r.status_code == 200, r.text
    prompt = httpx.get(f"{gateway.url}/acme/adder/prompt", headers=headers, timeout=60).json()
    assert prompt[0]["text"] == "What is 100 + 0?"
    call = httpx.post(f"{gateway.url}/acme/adder/call", headers=headers, timeout=60,
                      json={"name": "answer", "input": {"answer": "100"}})
    result = sse_result(call.text)
    assert result["ok"] is True and result["output"]["reward"] == 1.0 and result["output"]["finished"] is True
    httpx.post(f"{gateway.url}/delete", headers=headers, timeout=30)
    wait_until(lambda: Session.objects.get(sid=sid).status == "deleted", 10, "session deleted")
    assert Session.objects.get(sid=sid).runner


# What the openreward SDK adds: a conversation prompt (get_messages), a @terminal tool, async setup.
CHAT_ENV = '''
from openreward.environments import Environment, Message, Split, TextBlock, ToolOutput, terminal, tool
from pydantic import BaseModel


class Final(BaseModel):
    text: str


class Chat(Environment):
    @classmethod
    def list_splits(cls):
        return [Split(name="train", type="train")]

    @classmethod
    async def list_tasks(cls, split):
        return [{"q": "hi"}, {"q": "bye"}]

    async def setup(self):
        self.ready = True

    def get_messages(self):
        return [Message(role="system", blocks=[TextBlock(text="Be brief.")]),
                Message(role="user", blocks=[TextBlock(text=self.task_spec["q"])])]

    @tool
    def look(self) -> ToolOutput:
        """Look around."""
        return ToolOutput(blocks=[TextBlock(text="a room")])

    @terminal
    @tool
    async def submit(self, params: Final) -> ToolOutput:
        """The final message."""
        return ToolOutput(blocks=[TextBlock(text=params.text)], reward=1.0 if self.ready else 0.0, finished=True)
'''


async def test_openreward_conversation_prompts_and_terminal_tools_keep_their_sdk_meaning(client, owner):
    from orsplatform.catalog.models import EnvironmentVersion
    from orsplatform.hub.services import task_prompt_render
    from tests.catalog.support import in_thread

    r = await in_thread(publish)(owner, "chat", "chat.py", CHAT_ENV)
    assert r.status_code == 201, r.json()
    # The terminal tool is not offered to the model, as on the SDK's own server.
    assert [t["name"] for t in r.json()["tools"]] == ["look"]
    sid = await start_episode(client, owner.headers, env="acme/chat", split="train", index=1)
    headers = {**owner.headers, "X-Session-ID": sid}
    prompt = (await client.get("/prompt", headers=headers)).json()
    assert [b["text"] for b in prompt] == ["[system]", "Be brief.", "[user]", "bye"]
    assert prompt[0]["detail"] == {"role": "system"}
    # ...but it is called by name, after the async setup ran.
    r = await client.post("/call", headers=headers, json={"name": "submit", "input": {"text": "done"}})
    assert sse_result(r.text)["output"]["reward"] == 1.0
    # The environment pages render the same prompt without setup().
    version = await in_thread(lambda: EnvironmentVersion.objects.get(environment__slug="chat"))()
    rendered = await in_thread(task_prompt_render)(version=version, spec={"q": "hi"})
    assert [b["text"] for b in rendered["blocks"]] == ["[system]", "Be brief.", "[user]", "hi"], rendered


# Two calls at once on one session. The openreward SDK runs calls to one tool one at a time unless
# the tool says concurrent=True; the platform runs a session's calls one at a time whatever the SDK
# (tests/ors/test_calls.py), which keeps every rule of the SDK's. Each call waits (at most a second)
# for a second call to be inside the tool too, and reports how many it saw.
OVERLAP_ENV = '''
import threading

from openreward.environments import Environment, TextBlock, ToolOutput, tool


class Overlap(Environment):
    def __init__(self, task_spec={}, secrets={}):
        super().__init__(task_spec, secrets)
        self.inside = 0
        self.changed = threading.Condition()

    @classmethod
    def list_splits(cls):
        return ["train"]

    @classmethod
    def list_tasks(cls, split):
        return [{"n": 0}]

    def get_prompt(self):
        return [TextBlock(text="go")]

    def _visit(self) -> ToolOutput:
        with self.changed:
            self.inside += 1
            self.changed.notify_all()
            self.changed.wait_for(lambda: self.inside >= 2, timeout=1.0)
            seen = self.inside
        with self.changed:
            self.inside -= 1
        return ToolOutput(blocks=[TextBlock(text="ok")], metadata={"seen": seen})

    @tool
    def serial(self) -> ToolOutput:
        """One at a time (the SDK's default)."""
        return self._visit()

    @tool(concurrent=True)
    def parallel(self) -> ToolOutput:
        """Concurrent calls allowed."""
        return self._visit()
'''


async def test_an_openreward_sessions_calls_run_one_at_a_time_concurrent_tools_included(client, owner):
    import asyncio

    from tests.catalog.support import in_thread

    r = await in_thread(publish)(owner, "overlap", "overlap.py", OVERLAP_ENV)
    assert r.status_code == 201, r.json()
    sid = await start_episode(client, owner.headers, env="acme/overlap", split="train", index=0)
    headers = {**owner.headers, "X-Session-ID": sid}

    async def twice(name: str) -> list[int]:
        calls = [client.post("/call", headers=headers, json={"name": name, "input": {}}) for _ in range(2)]
        return sorted(sse_result(r.text)["output"]["metadata"]["seen"] for r in await asyncio.gather(*calls))

    assert await twice("serial") == [1, 1]
    assert await twice("parallel") == [1, 1]
