"""ors.client's split+index sessions name their environment only in the paths of later requests
(its /create carries no env_name): the episode must run on that environment, a team's own one
included, and nothing may be recorded against the default environment."""

from __future__ import annotations

import httpx
from ors.client import ORS

from orsplatform.episodes.models import Session
from tests.ors.support import publish_probe_sync


def test_a_split_and_index_session_runs_on_the_teams_own_environment_its_requests_name(server, owner, tmp_path):
    name = publish_probe_sync(owner.team, tmp_path)
    with ORS(base_url=server.url, api_key=owner.token) as client:
        env = client.environment(name)
        with env.session(split="test", index=2) as session:
            assert session.get_prompt()[0].text == "probe question test 2"
            result = session.call_tool("finish", {})
            assert (result.reward, result.finished) == (1.0, True)
            sid = session.sid
    rows = list(Session.objects.select_related("environment__team").all())
    assert [(r.sid, f"{r.environment.team.slug}/{r.environment.slug}", r.task_index, r.calls, r.status)
            for r in rows] == [(sid, name, 2, 1, Session.Status.DELETED)]
    assert rows[0].total_reward == 1.0 and rows[0].finished


def test_a_task_object_session_runs_on_the_teams_own_environment_with_no_stray_session(server, owner, tmp_path):
    name = publish_probe_sync(owner.team, tmp_path)
    with ORS(base_url=server.url, api_key=owner.token) as client:
        env = client.environment("probe")  # the bare slug, resolved within the caller's team
        task = env.list_tasks("train")[4]
        with env.session(task=task) as session:
            assert session.get_prompt()[0].text == "probe question train 4"
            assert session.call_tool("finish", {}).reward == 1.0
    rows = list(Session.objects.select_related("environment__team").all())
    assert [f"{r.environment.team.slug}/{r.environment.slug}" for r in rows] == [name]
    assert rows[0].task_spec == {"id": "train-4", "question": "probe question train 4"}


def _unbound_session(http, owner) -> dict:
    """A session whose /create names no environment (as ors.client's split+index sessions do)."""
    h = {"X-API-Key": owner.token}
    h["X-Session-ID"] = http.post("/create_session", headers=h).json()["sid"]
    assert http.post("/create", headers=h, json={"split": "test", "index": 0}).status_code == 200
    return h


def test_a_session_whose_requests_name_no_environment_either_runs_on_the_default(server, owner):
    with httpx.Client(base_url=server.url, timeout=30) as http:
        h = _unbound_session(http, owner)
        sid = h["X-Session-ID"]
        assert http.post("/ping", headers=h).json() == {"status": "ok"}
        assert not Session.objects.filter(sid=sid).exists()  # nothing recorded before it is bound
        assert http.get("/prompt", headers=h).status_code == 200
        assert http.post("/delete", headers=h).status_code == 200
    row = Session.objects.select_related("environment__team").get(sid=sid)
    assert f"{row.environment.team.slug}/{row.environment.slug}" == "builtin/math"


def test_an_unbound_session_that_is_deleted_leaves_nothing_behind(server, owner):
    with httpx.Client(base_url=server.url, timeout=30) as http:
        h = _unbound_session(http, owner)
        assert http.post("/delete", headers=h).json() == {"sid": h["X-Session-ID"]}
        assert http.get("/math/prompt", headers=h).status_code == 404
    assert not Session.objects.exists()
