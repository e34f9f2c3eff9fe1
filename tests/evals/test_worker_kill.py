"""A Celery worker killed mid-run loses no finished episode, and the run resumes on another worker.
Real worker processes against Redis (database 5 unless REDIS_URL says otherwise) and the test database."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid

import pytest
from celery import Celery

from orsplatform.evals import services
from orsplatform.evals.models import Agent, EvalEpisode, EvalRun
from tests.evals.aap_agent import expected_reward
from tests.evals.conftest import register
from tests.fixtures.celery import wait_until
from tests.fixtures.server import ROOT, database_url

REDIS = os.environ.get("ORS_TEST_EVALS_REDIS_URL", "redis://127.0.0.1:6379/5")
pytestmark = pytest.mark.e2e


class Workers:
    def __init__(self, tmp, agent_address: str) -> None:
        self.tmp = tmp
        self.agent_address = agent_address  # 127.0.0.1:PORT, the one place the workers may reach
        self.queue = f"evals-test-{uuid.uuid4().hex[:8]}"
        self.processes: list[subprocess.Popen] = []
        self.client = Celery(broker=REDIS)

    def start(self, name: str) -> subprocess.Popen:
        environ = {**os.environ, "DATABASE_URL": database_url(), "DJANGO_SETTINGS_MODULE": "orsplatform.settings",
                   "CELERY_BROKER_URL": REDIS, "CELERY_TASK_ALWAYS_EAGER": "false",
                   "CELERY_TASK_DEFAULT_QUEUE": self.queue, "ORS_EVAL_LEASE_SECONDS": "2",
                   "ORS_EVAL_AGENT_ALLOWED_HOSTS": self.agent_address, "ORS_REDIS_PREFIX": self.queue}
        environ.pop("REDIS_URL", None)  # in-process limits: the worker's own gateway
        log = (self.tmp / f"{name}.log").open("a")
        process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "orsplatform", "worker", "--pool", "threads", "--concurrency", "2",
             "-Q", self.queue, "--hostname", f"{name}@{self.queue}", "--loglevel", "warning", "--without-mingle",
             "--without-gossip"], cwd=ROOT, env=environ, stdout=log, stderr=subprocess.STDOUT)
        self.processes.append(process)
        return process

    def send(self, run_id: int) -> None:
        self.client.send_task("evals.run_eval", args=[run_id], queue=self.queue)

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=10)
        with self.client.connection_for_write() as connection:
            connection.default_channel.client.delete(self.queue)


@pytest.fixture
def workers(tmp_path, agents):
    w = Workers(tmp_path, agents.url.removeprefix("http://"))
    yield w
    w.stop()


def _scored(run_id: int) -> dict[int, tuple[str, float]]:
    return {e.task_index: (e.sid, e.reward) for e in
            EvalEpisode.objects.filter(run_id=run_id, status=EvalEpisode.Status.SCORED)}


def test_a_killed_worker_loses_no_finished_episode_and_the_run_resumes(owner, agents, workers):
    agent = Agent.objects.get(id=register(owner, agents, "solver", "delta")["id"])
    run = services.eval_run_launch(team=owner.team, agent=agent, environment="builtin/math", split="test",
                                   stop=150, concurrency=2, enqueue=False)
    first = workers.start("first")
    workers.send(run.id)
    wait_until(lambda: len(_scored(run.id)) >= 10, 90, "ten episodes scored by the first worker")
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=10)
    before = _scored(run.id)
    assert 10 <= len(before) < 150
    run.refresh_from_db()
    assert run.status == "running"  # nobody ended it: its worker is gone

    # The dead worker's lease lapses (2 s here), then the run may be resumed elsewhere.
    wait_until(lambda: EvalRun.objects.get(id=run.id).lease_until < _now(), 10, "the lease to lapse")
    services.eval_run_resume(run=EvalRun.objects.get(id=run.id), enqueue=False)
    workers.start("second")
    workers.send(run.id)
    wait_until(lambda: EvalRun.objects.get(id=run.id).status == "finished", 180, "the resumed run to finish")

    after = _scored(run.id)
    assert {i: reward for i, (_, reward) in after.items()} == {i: expected_reward("test", i) for i in range(150)}
    assert {i: after[i] for i in before} == before  # nothing scored before the kill was run again


def _now():
    from django.utils import timezone

    return timezone.now()
