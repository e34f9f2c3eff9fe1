"""Evaluations on a sealed split with hidden fields (docs/hidden-tasks.md): another team's run plays
the held-out tasks by split+index, what the platform sends the agent carries no hidden value, and
the leaderboard (page and REST API) says its results are on a sealed split."""

from __future__ import annotations

import json

from django.test import Client

from tests.catalog.support import login
from tests.catalog.vault import leaked, publish_vault
from tests.evals.conftest import api, launch, register, wait_run


def test_an_evaluation_on_a_sealed_split_sends_the_agent_no_hidden_value_and_its_board_says_sealed(
        owner, outsider, agents, settings, tmp_path):
    settings.ORS_PACKAGE_DIR, settings.ORS_UPLOAD_DIR = tmp_path / "packages", tmp_path / "uploads"
    publish_vault(owner)
    agent = register(outsider, agents, "silent", "none")
    run = wait_run(outsider, launch(outsider, agent["id"], environment="acme/vault", split="test", stop=4)["id"])
    assert run["status"] == "finished" and run["done"] == 4, run
    assert {e["task_index"] for e in run["episodes"]} == {0, 1, 2, 3}
    stats = agents.stats()
    assert len(stats["put_bodies"]) == 4
    assert any("Open vault test 2" in json.dumps(b) for b in stats["put_bodies"])  # the prompt did go
    assert leaked(json.dumps(stats)) == []
    assert leaked(json.dumps(run)) == []

    board = api(outsider).get("/api/v1/leaderboards/acme/vault?split=test")
    assert board.status_code == 200 and board.json()["sealed"] is True
    assert [r["sealed"] for r in board.json()["rows"]] == [True]
    page = login(outsider).get("/aap/globex/leaderboard/acme/vault/?split=test")
    assert page.status_code == 200 and b'id="board-sealed"' in page.content and not leaked(page.content)
    runs = login(outsider).get(f"/aap/globex/runs/{run['id']}/")
    assert runs.status_code == 200 and not leaked(runs.content)
    assert Client().get("/aap/globex/").status_code in (302, 403, 404)  # the pages are the team's own
