"""An evaluation over a container environment: the platform drives the reference AAP agent
(tests/evals/aap_agent.py, its "stepper" calling the ledger's one tool) through the episode gateway
to the image's server under gVisor, on the environment's sealed test split by split and index.
The hidden start reaches the server (the rewards say so), no hidden value reaches the agent, and
another team can neither launch on the environment nor read the run. Real engine, runsc, build,
Celery worker (tests/evals/conftest.py's, in this process), agent server."""

from __future__ import annotations

import json

from orsplatform.catalog.models import EnvironmentVersion
from orsplatform.catalog.pyenvs import log_path
from orsplatform.episodes.models import Session
from orsplatform.verify.models import Verification
from tests.catalog.support import publish, zip_bytes
from tests.containers.conftest import LEDGER_CANARY, LEDGER_TASKS, faces_package, wait_built
from tests.e2e.helpers import wait_for
from tests.evals.conftest import agent_server, agents, api, launch, platform_worker, register, wait_run  # noqa: F401

EVAL_SECONDS = 300  # the run's first episode starts the version's container


def test_an_evaluation_runs_a_container_environments_sealed_split_and_sends_the_agent_no_hidden_value(
        owner, outsider, agents, container_dirs, settings):  # noqa: F811 - the imported fixture
    # No spare: the gateway here is this process's, which outlives the test (a spare would be started
    # after it, with its database gone, and dropped at the process's exit).
    settings.ORS_CONTAINER_WARM_VERSIONS = 0
    r = publish(owner, "ledger", "ledger.zip", zip_bytes(faces_package()))
    assert r.status_code == 202, r.content
    version = wait_built("ledger")
    assert version.status == EnvironmentVersion.Status.READY, (version.error, log_path(version.id).read_text()[-3000:])
    # Held until its reference solution scored (the replay, on this process's worker).
    wait_for(lambda: Verification.objects.filter(version=version, status=Verification.Status.PASSED).exists(),
             timeout=EVAL_SECONDS, what="the reference solution's replay")

    agent = register(owner, agents, "stepper", "none")
    run = launch(owner, agent["id"], environment="acme/ledger", split="test", start=0, stop=3)
    run = wait_run(owner, run["id"], timeout=EVAL_SECONDS)
    assert run["status"] == "finished" and run["done"] == 3, run
    # Each episode: the hidden start, then the agent's step of 10.
    assert {e["task_index"]: e["reward"] for e in run["episodes"]} == {
        i: float(start + 10) for i, start in enumerate(LEDGER_TASKS["test"])}
    assert all(e["finished"] and e["error"] is None for e in run["episodes"]), run["episodes"]
    sessions = Session.objects.filter(sid__in=[e["sid"] for e in run["episodes"]])
    assert {(s.version_id, s.split, s.sealed) for s in sessions} == {(version.id, "test", True)}
    stats = agents.stats()
    assert len(stats["put_bodies"]) == 3 and '\\"balance\\":1' in json.dumps(stats["put_bodies"])
    assert LEDGER_CANARY not in json.dumps(stats) and LEDGER_CANARY not in json.dumps(run)

    # Tenancy: the environment is not there for another team, nor is the run.
    theirs = register(outsider, agents, "stepper", "none")
    refused = api(outsider).post("/api/v1/eval-runs", {"agent": theirs["id"], "environment": "acme/ledger",
                                                       "split": "test", "start": 0, "stop": 1}, format="json")
    assert refused.status_code == 400 and "not found" in json.dumps(refused.json()), refused.content
    hidden = api(outsider).get(f"/api/v1/eval-runs/{run['id']}")
    assert hidden.status_code == 404 and set(hidden.json()) == {"detail"}
