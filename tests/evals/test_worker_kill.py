"""A Celery worker killed mid-run loses no finished episode, and the run resumes on another worker.
Real worker processes against Redis (database 5 unless REDIS_URL says otherwise) and the test database."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid

import pytest
import redis
from celery import Celery

from orsplatform.episodes.models import ToolCall
from orsplatform.evals import services
from orsplatform.evals.models import Agent, EvalEpisode, EvalRun
from tests.evals.aap_agent import expected_reward
from tests.evals.conftest import database_dump, register
from tests.fixtures.celery import wait_until
from tests.fixtures.server import ROOT, database_url

REDIS = os.environ.get("ORS_TEST_EVALS_REDIS_URL", "redis://127.0.0.1:6379/5")
RABBITMQ = os.environ.get("ORS_TEST_EVALS_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")
SECRET = "tok-9f81c3-never-stored"
pytestmark = pytest.mark.e2e


class Workers:
    """Celery workers in their own processes on a queue of their own. On Redis the broker's keys carry
    a prefix of their own too, so the short visibility timeout these workers use (a killed worker's
    message comes back within seconds) only ever applies to this test's messages. RabbitMQ gives a
    killed worker's message to another at once (its connection closed)."""

    def __init__(self, tmp, broker: str = REDIS) -> None:
        self.tmp = tmp
        self.broker = broker
        self.queue = f"evals-test-{uuid.uuid4().hex[:8]}"
        # Redis looks for overdue unacknowledged messages every interval x throttle seconds (100 by
        # default): every second here. The look is under a mutex that a worker killed while holding
        # it keeps for unacked_mutex_expire seconds (300 by default): 2 here.
        self.transport = {"visibility_timeout": 6, "unacked_restore_interval": 1, "unacked_restore_throttle": 1,
                          "unacked_mutex_expire": 2,
                          "global_keyprefix": f"{self.queue}:"} if broker.startswith("redis") else {}
        self.processes: list[subprocess.Popen] = []
        self.logs: list = []
        self.client = Celery(broker=broker, broker_transport_options=self.transport)

    def start(self, name: str, lease: float = 2, slice_seconds: float = 3) -> subprocess.Popen:
        environ = {**os.environ, "DATABASE_URL": database_url(), "DJANGO_SETTINGS_MODULE": "orsplatform.settings",
                   "CELERY_BROKER_URL": self.broker, "CELERY_TASK_ALWAYS_EAGER": "false",
                   "CELERY_TASK_DEFAULT_QUEUE": self.queue, "ORS_EVAL_LEASE_SECONDS": str(lease),
                   "ORS_EVAL_SLICE_SECONDS": str(slice_seconds),
                   "CELERY_BROKER_TRANSPORT_OPTIONS": json.dumps(self.transport),
                   "ORS_EVAL_AGENT_ALLOWED_HOSTS": "127.0.0.1/32", "ORS_REDIS_PREFIX": self.queue}
        environ.pop("REDIS_URL", None)  # in-process limits: the worker's own gateway
        path = self.tmp / f"{name}.log"
        self.logs.append(path)
        process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "orsplatform", "worker", "--pool", "threads", "--concurrency", "2",
             "-Q", self.queue, "--hostname", f"{name}@{self.queue}", "--loglevel", "info", "--without-mingle",
             "--without-gossip"], cwd=ROOT, env=environ, stdout=path.open("a"), stderr=subprocess.STDOUT)
        self.processes.append(process)
        return process

    def send(self, run: EvalRun, secrets: dict[str, str] | None = None) -> None:
        """The run's task message, exactly as the platform sends it (secrets sealed inside)."""
        self.client.send_task("evals.run_eval", args=services.eval_run_task_args(run=run, secrets=secrets),
                              queue=self.queue)

    def redis_dump(self) -> str:
        """Every key of the broker's database (this test's and anyone else's) with its value."""
        r = redis.Redis.from_url(REDIS)
        out = []
        read = {b"string": r.get, b"list": lambda k: r.lrange(k, 0, -1), b"hash": r.hgetall, b"set": r.smembers,
                b"zset": lambda k: r.zrange(k, 0, -1)}
        for key in r.scan_iter(count=1000):
            value = read.get(r.type(key), lambda k: b"")(key)
            out.append(f"{key!r} {value!r}")
        return "\n".join(out)

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=10)
        if self.broker.startswith("redis"):
            r = redis.Redis.from_url(REDIS)
            for key in r.scan_iter(match=f"{self.queue}*", count=1000):
                r.delete(key)
        else:
            with self.client.connection_for_write() as connection:
                connection.default_channel.queue_delete(self.queue)


@pytest.fixture
def workers(request, tmp_path):
    w = Workers(tmp_path, getattr(request, "param", REDIS))
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
    workers.send(run)
    wait_until(lambda: len(_scored(run.id)) >= 10, 90, "ten episodes scored by the first worker")
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=10)
    before = _scored(run.id)
    assert 10 <= len(before) < 150
    run.refresh_from_db()
    assert run.status == "running"  # nobody ended it: its worker is gone

    # The dead worker's lease lapses (2 s here), then the run may be resumed elsewhere.
    # (No lease at all if the kill fell between two slices of the run.)
    wait_until(lambda: (lease := EvalRun.objects.get(id=run.id).lease_until) is None or lease < _now(), 10,
               "the lease to lapse")
    resumed = services.eval_run_resume(run=EvalRun.objects.get(id=run.id), enqueue=False)
    workers.start("second")
    workers.send(resumed)
    wait_until(lambda: EvalRun.objects.get(id=run.id).status == "finished", 180, "the resumed run to finish")

    after = _scored(run.id)
    assert {i: reward for i, (_, reward) in after.items()} == {i: expected_reward("test", i) for i in range(150)}
    assert {i: after[i] for i in before} == before  # nothing scored before the kill was run again


def _now():
    from django.utils import timezone

    return timezone.now()


def _secrets_seen(run_id: int) -> list:
    sids = EvalEpisode.objects.filter(run_id=run_id).values_list("sid", flat=True)
    return [c.output["output"]["metadata"]["secrets_seen"] for c in
            ToolCall.objects.filter(session__sid__in=list(sids), name="submit")]


@pytest.mark.parametrize("workers", [REDIS, RABBITMQ], ids=["redis", "rabbitmq"], indirect=True)
def test_a_worker_killed_mid_run_gets_the_secrets_back_with_the_redelivered_message(owner, agents, workers):
    agent = Agent.objects.get(id=register(owner, agents, "solver", "delta")["id"])
    total = 500  # enough that the kill lands mid-run on a quick machine too
    run = services.eval_run_launch(team=owner.team, agent=agent, environment="builtin/math", split="test",
                                   stop=total, concurrency=2, secrets={"TOKEN": SECRET}, enqueue=False)
    # On RabbitMQ a lease longer than the next worker takes to start: the message comes back while
    # the dead worker's lease still stands, so the worker must look again rather than drop it.
    lease = 2 if workers.broker == REDIS else 10
    first = workers.start("first", slice_seconds=2, lease=lease)
    workers.send(run, {"TOKEN": SECRET})
    # Past its first slice, so the message the kill leaves unacknowledged is a continuation the
    # worker sent itself: the secrets must have been passed along.
    wait_until(lambda: len(_scored(run.id)) >= 10 and EvalRun.objects.get(id=run.id).started_at
               and (_now() - EvalRun.objects.get(id=run.id).started_at).total_seconds() > 3.5, 90,
               "ten episodes scored, and the first slice over")
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=10)
    before = _scored(run.id)
    assert 10 <= len(before) < total

    # Nobody resumes it: the broker hands the killed worker's message to the next worker, with the
    # secrets sealed inside (Redis: once its visibility timeout passed; RabbitMQ: at once, and the
    # worker looks again when the dead worker's lease has lapsed).
    workers.start("second", lease=lease)
    wait_until(lambda: EvalRun.objects.get(id=run.id).status == "finished", 180, "the run to finish by itself")
    after = _scored(run.id)
    assert {i: reward for i, (_, reward) in after.items()} == {i: expected_reward("test", i) for i in range(total)}
    assert {i: after[i] for i in before} == before  # nothing scored before the kill was run again
    assert _secrets_seen(run.id) == [["TOKEN"]] * total  # every episode's environment had the secret

    # Stored nowhere: not in any row of any table, not in the broker, not in the workers' logs.
    assert EvalRun.objects.get(id=run.id).secret_names == ["TOKEN"]
    assert SECRET not in database_dump()
    assert SECRET not in workers.redis_dump()
    assert all(SECRET not in log.read_text() for log in workers.logs)


def test_a_run_stuck_in_queued_resumes_and_is_never_driven_by_two_workers_at_once(owner, agents, workers):
    from tests.evals.conftest import api

    agent = Agent.objects.get(id=register(owner, agents, "solver", "message")["id"])
    run = services.eval_run_launch(team=owner.team, agent=agent, environment="builtin/math", split="test",
                                   stop=40, concurrency=2, secrets={"TOKEN": SECRET}, enqueue=False)
    # Its message was sent but no worker took it (as if the broker had lost it): the run is queued.
    workers.send(run, {"TOKEN": SECRET})
    assert EvalRun.objects.get(id=run.id).status == "queued"

    r = api(owner).post(f"/api/v1/eval-runs/{run.id}/resume", {}, format="json")
    assert r.status_code == 400 and "missing: TOKEN" in r.json()["detail"]
    resumed = services.eval_run_resume(run=EvalRun.objects.get(id=run.id), secrets={"TOKEN": SECRET},
                                       enqueue=False)
    assert resumed.status == "queued" and resumed.generation == 1
    # Two workers, three messages: the first message turns up after all (an older generation: dropped),
    # and the resumed one is delivered twice (one for each worker, at once).
    workers.send(resumed, {"TOKEN": SECRET})
    workers.send(resumed, {"TOKEN": SECRET})
    workers.start("one", lease=10)
    workers.start("two", lease=10)
    running = wait_until(lambda: (r := EvalRun.objects.get(id=run.id)).status == "running" and r, 60, "a worker to claim")
    assert running.lease_generation == 1
    r = api(owner).post(f"/api/v1/eval-runs/{run.id}/resume", {"secrets": {"TOKEN": SECRET}}, format="json")
    assert r.status_code == 400 and "it will go on by itself" in r.json()["detail"]
    wait_until(lambda: EvalRun.objects.get(id=run.id).status == "finished", 180, "the resumed run to finish")

    after = _scored(run.id)
    assert {i: reward for i, (_, reward) in after.items()} == {i: expected_reward("test", i) for i in range(40)}
    stats = agents.stats()
    # One engine at a time: every task was started exactly once, never more than `concurrency` at once.
    assert stats["created"] == 40 and stats["deleted"] == 40 and stats["max_open"] <= 2, stats
    assert _secrets_seen(run.id) == [["TOKEN"]] * 40
    assert SECRET not in database_dump() and SECRET not in workers.redis_dump()
