"""The scheduled flags check over real episodes: an environment of acme ("gauge", two versions) is
played through the ORS face (sandbox workers, the audit log), then the beat's task function runs and
each kind of flag is read back through the REST API and the environment page, with links to the
episodes behind it; another team sees none of them."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from asgiref.sync import sync_to_async
from django.test import Client

from orsplatform.flags.models import Flag
from orsplatform.flags.tasks import compute
from tests.analytics.conftest import login
from tests.fixtures.ors import parse_sse, start_episode
from tests.ors.support import in_db

GAUGE = textwrap.dedent('''
    from ors import Environment, Split, TextBlock, ToolOutput, tool
    from pydantic import BaseModel

    BROKEN = {broken}  # version 2 breaks score: every call raises


    class Value(BaseModel):
        value: float


    class Gauge(Environment):
        @classmethod
        def list_splits(cls):
            return [Split(name="train", type="train")]

        @classmethod
        def list_tasks(cls, split):
            return [{{"id": i}} for i in range(3)]

        def get_prompt(self):
            return [TextBlock(text="Poke, then score.")]

        @tool
        def poke(self) -> ToolOutput:
            """Look around."""
            return ToolOutput(blocks=[TextBlock(text="nothing here")], reward=0.0, finished=False)

        @tool
        def score(self, params: Value) -> ToolOutput:
            """Claim a score (the task is a stand-in for one whose reward can be gamed)."""
            if BROKEN:
                raise RuntimeError("score is broken in this version")
            return ToolOutput(blocks=[TextBlock(text="scored")], reward=params.value, finished=True)
''')

MANIFEST = 'name = "gauge"\nentrypoint = "env:Gauge"\nreward_range = [0, 1]\n'


def publish_gauge(team, tmp_path: Path, *, broken: bool) -> None:
    from orsplatform.catalog.services import environment_publish

    src = tmp_path / f"gauge_{int(broken)}"
    src.mkdir()
    (src / "env.py").write_text(GAUGE.format(broken=broken))
    (src / "manifest.toml").write_text(MANIFEST)
    environment_publish(team=team, source_dir=src, visibility="private")


async def episode(client, person, env: str, index: int, calls: list[tuple[str, dict]], run: str = "") -> str:
    headers = {**person.headers, **({"X-Run": run} if run else {})}
    sid = await start_episode(client, headers, env=env, split="train", index=index)
    headers["X-Session-ID"] = sid
    for name, tool_input in calls:
        r = await client.post(f"/{env}/call", headers=headers, json={"name": name, "input": tool_input})
        assert r.status_code == 200 and parse_sse(r.text)[-1][0] in ("end", "error"), r.text
    assert (await client.post("/delete", headers=headers)).status_code == 200
    return sid


POKE, PASS, FAIL = ("poke", {}), ("score", {"value": 1.0}), ("score", {"value": 0.0})


@pytest.fixture
async def played(client, owner, tmp_path, settings) -> dict[str, list[str]]:
    """Real episodes behind one flag of each kind; the sids, by what they are."""
    settings.ORS_FLAGS_MIN_CALLS = 10
    await in_db(publish_gauge, owner.team, tmp_path, broken=False)
    v1 = "acme/gauge@1"
    sids: dict[str, list[str]] = {"slow": [], "fast": [], "alpha": [], "beta": [], "v1": [], "v2": []}
    for _ in range(5):  # task 1: passes take four calls...
        sids["slow"].append(await episode(client, owner, v1, 1, [POKE, POKE, POKE, PASS]))
    sids["fast"].append(await episode(client, owner, v1, 1, [PASS]))  # ...but this one takes one
    for _ in range(5):  # task 2: run alpha passes, run beta fails
        sids["alpha"].append(await episode(client, owner, v1, 2, [PASS], run="alpha"))
    for _ in range(5):
        sids["beta"].append(await episode(client, owner, v1, 2, [FAIL], run="beta"))
    for _ in range(5):  # task 0 on v1: passes, no errors
        sids["v1"].append(await episode(client, owner, v1, 0, [POKE, PASS]))
    sids["out_of_range"] = [await episode(client, owner, v1, 0, [POKE, ("score", {"value": 7.0})])]
    await in_db(publish_gauge, owner.team, tmp_path, broken=True)
    for _ in range(5):  # task 0 on v2: score raises, nothing passes
        sids["v2"].append(await episode(client, owner, "acme/gauge", 0, [POKE, PASS]))
    return sids


def _flags() -> dict[str, Flag]:
    return {f.kind: f for f in Flag.objects.select_related("version").all()}


async def test_the_scheduled_task_flags_each_anomaly_and_links_its_episodes(played, owner):
    assert await sync_to_async(compute)() == 5
    flags = await sync_to_async(_flags)()
    assert set(flags) == {"fast_pass", "run_jump", "version_jump", "reward_range", "error_burst"}

    fast = flags["fast_pass"]
    assert fast.sessions == played["fast"] and (fast.split, fast.task_index) == ("train", 1)
    assert fast.details["typical_calls"] == 4 and fast.details["fewest_calls"] == 1

    runs = flags["run_jump"]
    assert runs.run_name == "beta" and runs.task_index == 2
    assert (runs.details["rate_from"], runs.details["rate_to"]) == (1.0, 0.0)
    assert set(runs.sessions) == set(played["alpha"] + played["beta"])

    versions = flags["version_jump"]
    assert versions.version.number == 2 and versions.task_index == 0
    assert (versions.details["from"], versions.details["to"]) == (1, 2)
    assert versions.details["rate_to"] == 0.0 and set(played["v2"]) <= set(versions.sessions)

    out = flags["reward_range"]
    assert out.sessions == played["out_of_range"] and out.details["range"] == [0, 1]
    assert out.details["highest"] == 7.0 and out.version.number == 1

    burst = flags["error_burst"]
    assert burst.version.number == 2 and set(burst.sessions) == set(played["v2"])
    assert burst.details["rate_to"] == 0.5 and burst.details["rate_from"] == 0.0


async def test_a_second_pass_refreshes_flags_instead_of_adding_more(played):
    await sync_to_async(compute)()
    first = await sync_to_async(lambda: dict(Flag.objects.values_list("key", "first_seen_at")))()
    await sync_to_async(compute)()
    again = await sync_to_async(lambda: dict(Flag.objects.values_list("key", "first_seen_at")))()
    assert again == first


def _rest_and_page(owner, member, outsider) -> None:
    for person in (owner, member):
        client = login(person)
        r = client.get("/api/v1/flags", headers={"X-API-Key": person.token})
        assert r.status_code == 200
        flags = r.json()["flags"]
        assert {f["kind"] for f in flags} == {"fast_pass", "run_jump", "version_jump", "reward_range", "error_burst"}
        fast = next(f for f in flags if f["kind"] == "fast_pass")
        assert fast["environment"] == "acme/gauge" and fast["version"] == 1 and fast["task_index"] == 1
        (link,) = fast["episodes"]
        assert link["page"] == f"/analytics/acme/sessions/{link['sid']}/"
        assert client.get(link["page"]).status_code == 200
        assert client.get(link["api"], headers={"X-API-Key": person.token}).json()["sid"] == link["sid"]
        only_beta = client.get("/api/v1/flags?run=beta", headers={"X-API-Key": person.token}).json()["flags"]
        assert [f["kind"] for f in only_beta] == ["run_jump"]
        narrowed = client.get("/api/v1/flags?environment=acme/gauge&kind=error_burst",
                              headers={"X-API-Key": person.token}).json()["flags"]
        assert [f["kind"] for f in narrowed] == ["error_burst"]
        page = client.get("/analytics/acme/environments/acme/gauge/").content.decode()
        assert "Passed in far fewer calls than the task&#x27;s typical pass" in page
        assert f"/analytics/acme/sessions/{link['sid']}/" in page

    stranger = login(outsider)
    r = stranger.get("/api/v1/flags", headers={"X-API-Key": outsider.token})
    assert r.status_code == 200 and r.json() == {"flags": []}
    r = stranger.get("/api/v1/flags?environment=acme/gauge", headers={"X-API-Key": outsider.token})
    assert r.status_code == 404 and set(r.json()) == {"detail"}
    assert stranger.get("/analytics/globex/environments/acme/gauge/").status_code == 404
    assert "acme/gauge" not in json.dumps(
        stranger.get("/api/v1/flags?run=beta", headers={"X-API-Key": outsider.token}).json())
    r = stranger.get("/api/v1/flags?kind=nonsense", headers={"X-API-Key": outsider.token})
    assert r.status_code == 400 and r.json() == {"detail": 'kind: "nonsense" is not a valid choice.'}
    assert Client().get("/api/v1/flags").status_code in (401, 403)


async def test_flags_are_shown_to_the_team_only_through_rest_and_the_environment_page(played, owner, member, outsider):
    await sync_to_async(compute)()
    await sync_to_async(_rest_and_page)(owner, member, outsider)
