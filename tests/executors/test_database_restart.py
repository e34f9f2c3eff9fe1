"""A database restart under load, with the celery executor and real processes: while PostgreSQL is
gone every request that needs it answers 503 with Retry-After at once (never a 500, never a hang),
and once it is back the same processes serve again, with nothing half-written. And the harsher
outage, a database that accepts connections but never answers: the connect timeout bounds it.

PostgreSQL itself is shared by every test (and holds the test database), so the restart is what
its clients see of one: a TCP proxy between the platform's processes and the server resets every
connection and refuses new ones, then listens again on the same port (tests/fixtures/tcp_proxy.py).
The test process itself talks to PostgreSQL directly, so it can check the rows at any time.

When the suite runs on SQLite (no server to lose), the platform's processes are given a throwaway
PostgreSQL database of their own on the same server instead (tests/fixtures/server_database.py),
and the test checks its rows there: the tests run, and the same, on either.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from dataclasses import dataclass

import httpx
import pytest

from orsplatform.episodes.models import Session, ToolCall
from orsplatform.executors.keys import Keys
from tests.fixtures.celery import wait_until
from tests.fixtures.ors import parse_sse

pytestmark = pytest.mark.e2e

FAST = 10.0  # seconds: the bound on any answer, during the outage included ("fail fast")
OPEN = {Session.Status.CREATING, Session.Status.READY}
# A code task whose call takes as long as the test wants (as in test_celery_executor.py).
SLOW_TASK = {"task_spec": {"id": "sleepy", "prompt": "sleep", "entry": "f", "tests": ["assert f() == 1"],
                           "timeout_seconds": 60}}
SLEEPY = "import time\ntime.sleep({s})\ndef f():\n    return 1\n"


@pytest.fixture
def proxied_database_url(server_database, tcp_proxy) -> str:
    """The platform's database (the test database on PostgreSQL, a database of its own on SQLite),
    reached through the proxy: what the platform's processes are given."""
    assert tcp_proxy.upstream == (server_database.host, server_database.port)
    return server_database.url(port=tcp_proxy.port)


@dataclass
class Answer:
    op: str
    sid: str
    started: float  # time.monotonic() when the request was sent
    seconds: float
    status: int | None  # None: no HTTP answer at all (connection error or client timeout)
    body: str = ""
    retry_after: str | None = None
    task_id: str | None = None
    result: dict | None = None  # a /call's result, when its stream delivered one

    def refused(self) -> bool:
        """The answer a client can act on while the database is down: 503, when to retry, and why."""
        if self.status != 503 or not self.retry_after:
            return False
        try:
            return bool(json.loads(self.body).get("detail"))
        except ValueError:
            return False


def ask(client: httpx.Client, op: str, method: str, path: str, person, sid: str = "", **kwargs) -> Answer:
    headers = {**person.headers, "X-Session-ID": sid} if sid else person.headers
    started = time.monotonic()
    try:
        r = client.request(method, path, headers=headers, **kwargs)
    except httpx.HTTPError as exc:
        return Answer(op, sid, started, time.monotonic() - started, None, repr(exc))
    answer = Answer(op, sid, started, time.monotonic() - started, r.status_code, r.text, r.headers.get("Retry-After"))
    if op == "call" and r.status_code == 200:
        events = parse_sse(r.text)
        answer.task_id = next((d for e, d in events if e == "task_id"), None)
        if events and events[-1][0] == "end":
            answer.result = json.loads("".join(d for e, d in events if e in ("chunk", "end")))
    return answer


def episode(client: httpx.Client, person, answer: str, record: list[Answer], keep_open: bool = False,
            env: str = "math", create: dict | None = None) -> str | None:
    """create_session, /create, a submit that ends it, /delete: the sid if every step worked."""
    a = ask(client, "create_session", "POST", "/create_session", person)
    record.append(a)
    if a.status != 200:
        return None
    sid = json.loads(a.body)["sid"]
    steps = [("create", "POST", f"/{env}/create", {"json": create or {"split": "train", "index": 0}})]
    if not keep_open:
        steps += [("call", "POST", "/math/call", {"json": {"name": "submit", "input": {"answer": answer}}}),
                  ("delete", "POST", "/delete", {})]
    for op, method, path, kwargs in steps:
        a = ask(client, op, method, path, person, sid, **kwargs)
        record.append(a)
        if a.status != 200 or (op == "call" and not (a.result or {}).get("ok")):
            return None
    return sid


def running_call_of(cluster, sid: str) -> bool:
    """The session has a call running: the gateway keeps a marker in Redis until its row is written,
    indexed in the running calls' sorted set (read that, not a SCAN of a shared server's keys)."""
    keys = Keys(cluster.prefix)
    for task_id in cluster.redis.zrange(keys.calls, 0, -1):
        raw = cluster.redis.get(keys.call(task_id.decode()))
        if raw is not None and json.loads(raw).get("sid") == sid:
            return True
    return False


class Load:
    """Episodes run back to back from a few threads, as trainers do, recording every answer."""

    def __init__(self, base: str, person, answer: str, threads: int = 3) -> None:
        self.answers: list[Answer] = []  # appended from the threads (atomic under the GIL)
        self.completed: list[tuple[float, str]] = []  # (start time, sid) of the episodes that worked
        self._base, self._person, self._answer = base, person, answer
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, name=f"load-{n}") for n in range(threads)]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)
        assert not any(t.is_alive() for t in self._threads), "a load thread hangs on the gateway"

    def _run(self) -> None:
        with httpx.Client(base_url=self._base, timeout=30) as client:
            while not self._stop.is_set():
                started = time.monotonic()
                sid = episode(client, self._person, self._answer, self.answers)
                if sid is not None:
                    self.completed.append((started, sid))
                else:
                    # A client told to retry backs off (briefly here: this is load, not a pause
                    # the test waits on), so the outage is not a busy loop on a 2-core machine.
                    self._stop.wait(0.2)


def test_a_database_restart_under_load_fails_requests_fast_and_recovers_without_a_restart(
        proxied_database_url, tcp_proxy, cluster, server_factory, owner, server_database):
    # The rows are checked where the platform's processes write them.
    sessions = Session.objects.db_manager(server_database.alias)
    tool_calls = ToolCall.objects.db_manager(server_database.alias)
    cluster.start_runner()
    # The platform worker goes through the proxy too: its beat (the sweeper that records calls a
    # gateway could not) lives through the same restart.
    cluster.start_platform_worker(DATABASE_URL=proxied_database_url, ORS_SWEEP_EVERY_SECONDS="0.5",
                                  ORS_ORPHAN_AFTER_SECONDS="1")
    worker = cluster.others[0]
    gateway = server_factory(**cluster.env(DATABASE_URL=proxied_database_url))
    pid = gateway.process.pid
    client = httpx.Client(base_url=gateway.url, timeout=30)
    answers: list[Answer] = []

    # Healthy, through the proxy: a full episode, one left open to live through the restart, and
    # one to be deleted while the database is down.
    r = client.post("/math/task", headers=owner.headers, json={"split": "train", "index": 0})
    assert r.status_code == 200, r.text
    right = str(r.json()["task"]["answer"])
    before = episode(client, owner, right, answers)
    assert before is not None, answers
    kept = episode(client, owner, right, answers, keep_open=True)
    doomed = episode(client, owner, right, answers, keep_open=True)
    assert kept and doomed, answers
    assert tcp_proxy.accepted > 0, "the gateway must reach the database through the proxy"

    # A call still running on its runner when the database goes: it ends during the outage.
    slow_sid = episode(client, owner, right, answers, keep_open=True, env="code", create=SLOW_TASK)
    assert slow_sid, answers
    in_flight: list[Answer] = []

    def slow_call() -> None:
        with httpx.Client(base_url=gateway.url, timeout=60) as own:
            in_flight.append(ask(own, "call", "POST", "/code/call", owner, slow_sid,
                                 json={"name": "run", "input": {"code": SLEEPY.format(s=3)}}))

    caller = threading.Thread(target=slow_call)

    load = Load(gateway.url, owner, right)
    load.start()
    try:
        wait_until(lambda: len(load.completed) >= 3, 60, "episodes complete under load")
        caller.start()
        wait_until(lambda: running_call_of(cluster, slow_sid), 15, "the slow call runs")
        # The gateway and the worker hold connections for the cut to break (not only new ones to refuse).
        assert tcp_proxy.open_connections > 0
        connections_before = tcp_proxy.accepted
        tcp_proxy.cut()
        cut_at = time.monotonic()

        # A new episode needs its row: refused at once, and nothing is left of it.
        refused_sid = str(uuid.uuid4())
        a = ask(client, "create", "POST", "/math/create", owner, refused_sid, json={"split": "train", "index": 0})
        answers.append(a)
        assert a.refused(), (a.status, a.retry_after, a.body)
        # Ending an episode needs its durable end: refused too (the client retries it below).
        a = ask(client, "delete", "POST", "/delete", owner, doomed)
        answers.append(a)
        assert a.refused(), (a.status, a.retry_after, a.body)
        # /ping, /prompt and /call may be answered from the gateway's short caches for a moment;
        # once those expire they need the session's row, and the answer is 503 as well.
        wait_until(lambda: ask(client, "ping", "POST", "/ping", owner, kept).refused(), 30,
                   "/ping needs the database once its cache expired")
        for op, method, path, kwargs in [("prompt", "GET", "/math/prompt", {}),
                                         ("call", "POST", "/math/call",
                                          {"json": {"name": "submit", "input": {"answer": right}}})]:
            a = ask(client, op, method, path, owner, kept, **kwargs)
            answers.append(a)
            assert a.refused(), (op, a.status, a.retry_after, a.body)
        # And once the API key cache expires, authenticating a request needs the database: 503 too.
        wait_until(lambda: ask(client, "create_session", "POST", "/create_session", owner).refused(), 30,
                   "authentication needs the database once the key cache expired")
        # Readiness says why; liveness does not fail, so nothing restarts the gateway over it.
        r = client.get("/ready")
        assert r.status_code == 503 and r.json()["database"] == "down", r.text
        assert client.get("/health").status_code == 200
        # The load saw the outage as well.
        wait_until(lambda: any(a.started > cut_at and a.refused() for a in load.answers), 30,
                   "the load gets 503s while the database is down")
        # The call that was running ends while the database is still down: its client gets the result
        # (the tool ran; the episode moved on); its audit row is owed, checked below.
        caller.join(timeout=30)
        assert not caller.is_alive() and in_flight[0].result, in_flight
        assert in_flight[0].result["ok"] and in_flight[0].result["output"]["reward"] == 1.0, in_flight[0].body

        tcp_proxy.restore()
        restored_at = time.monotonic()

        def recovered() -> bool:
            return episode(client, owner, right, answers) is not None

        wait_until(recovered, 60, "a full episode through the same gateway after the database came back",
                   interval=0.5)
        wait_until(lambda: any(started > restored_at for started, _ in load.completed), 60,
                   "the load completes episodes again")
    finally:
        load.stop()
    answers += in_flight

    # The same processes: nothing was restarted to recover.
    assert gateway.process.poll() is None and gateway.process.pid == pid, gateway.log()
    assert worker.poll() is None and all(p.poll() is None for p in cluster.runners.values())
    assert tcp_proxy.accepted > connections_before, "the gateway reconnected by itself"
    assert client.get("/ready").json()["database"] == "ok"

    answers += load.answers
    # Fast, and never a 500 or no answer at all: every answer is a success or a proper refusal.
    slow = [a for a in answers if a.seconds > FAST]
    assert not slow, [(a.op, a.status, round(a.seconds, 2)) for a in slow]
    wrong = [a for a in answers if a.status != 200 and not a.refused()]
    assert not wrong, [(a.op, a.status, a.retry_after, a.body[:200]) for a in wrong]
    # Nor a stream that began and then ended in an error instead of the tool's result.
    broken = [a for a in answers if a.op == "call" and a.status == 200 and a.result is None]
    assert not broken, [a.body[:300] for a in broken]
    during = [a for a in answers if cut_at < a.started < restored_at]
    assert any(a.refused() for a in during)

    # A refused /delete left the session as it was, its instance on the runner included.
    a = ask(client, "call", "POST", "/math/call", owner, doomed, json={"name": "submit", "input": {"answer": "0"}})
    assert a.result is not None and a.result["ok"], a.body
    # Refused requests can be retried once the database is back, as Retry-After promises.
    retries = [ask(client, "create", "POST", "/math/create", owner, refused_sid, json={"split": "train", "index": 0}),
               ask(client, "delete", "POST", "/delete", owner, doomed)]
    answers += retries
    assert [a.status for a in retries] == [200, 200], [a.body for a in retries]
    assert sessions.get(sid=doomed).status == Session.Status.DELETED
    # The session opened before the restart lived through it, on its runner and in its row.
    assert sessions.get(sid=kept).status in OPEN
    a = ask(client, "call", "POST", "/math/call", owner, kept, json={"name": "submit", "input": {"answer": right}})
    assert a.result and a.result["ok"] and a.result["output"]["reward"] == 1.0, a.body
    answers.append(a)
    assert sessions.get(sid=before).status == Session.Status.DELETED

    # Nothing half-written. Every episode the gateway said it created has its row; every one it
    # said it deleted is deleted; a /create refused while the database was unreachable left no row.
    created = {a.sid for a in answers if a.op == "create" and a.status == 200}
    rows = dict(sessions.filter(sid__in=created).values_list("sid", "status"))
    assert set(rows) == created
    deleted = {a.sid for a in answers if a.op == "delete" and a.status == 200}
    assert {rows[sid] for sid in deleted} == {Session.Status.DELETED}
    # (A request in flight at the cut may have committed without hearing so; only later ones count.)
    refused_later = {a.sid for a in during if a.op == "create" and a.refused()} - created
    assert not sessions.filter(sid__in=refused_later).exists()
    # Every result a client received is in the audit log, with the reward the client saw: written
    # by the gateway, or, for a call that ended while the database was down, by the sweeper from
    # the runner's result once the database was back.
    delivered = {a.task_id: a.result for a in answers if a.op == "call" and a.result is not None}

    def all_audited() -> bool:
        return tool_calls.filter(task_id__in=delivered).count() == len(delivered)

    assert in_flight[0].task_id in delivered
    wait_until(all_audited, 30, "every delivered result in the audit log", interval=0.2)
    for call in tool_calls.filter(task_id__in=delivered):
        result = delivered[call.task_id]
        assert call.status == ToolCall.Status.OK and result["ok"], (call.task_id, call.status, result)
        assert call.reward == result["output"]["reward"]


def test_a_database_that_stops_answering_fails_requests_within_the_connect_timeout_and_recovers(
        proxied_database_url, tcp_proxy, cluster, server_factory, owner, server_database):
    # Worse than a restart: new connections are accepted and never answered (a frozen host), so
    # nothing refuses them and only a connect timeout bounds the wait. It is the operator's, in the
    # DATABASE_URL; it must hold for Django's connections and for the hot writes' own alike.
    sessions = Session.objects.db_manager(server_database.alias)
    cluster.start_runner()
    gateway = server_factory(**cluster.env(
        DATABASE_URL=f"{proxied_database_url}?connect_timeout=2",
        # Keys and environments from memory: every /create below goes straight to its write.
        ORS_AUTH_CACHE_SECONDS="300", ORS_CATALOG_CACHE_SECONDS="300"))
    pid = gateway.process.pid
    client = httpx.Client(base_url=gateway.url, timeout=30)
    answers: list[Answer] = []
    r = client.post("/math/task", headers=owner.headers, json={"split": "train", "index": 0})
    right = str(r.json()["task"]["answer"])
    kept = episode(client, owner, right, answers, keep_open=True)
    assert kept and episode(client, owner, right, answers), answers

    tcp_proxy.hang()
    hung_at = time.monotonic()
    # More than there are hot-write connections, so each of them has to connect anew.
    for _ in range(4):
        answers.append(ask(client, "create", "POST", "/math/create", owner, str(uuid.uuid4()),
                           json={"split": "train", "index": 0}))
    # A read of the session's row, on a DB thread's Django connection, once its cache expired.
    wait_until(lambda: answers.append(ask(client, "ping", "POST", "/ping", owner, kept)) or answers[-1].refused(),
               30, "/ping needs the database once its cache expired")
    during = [a for a in answers if a.started > hung_at]
    assert all(a.refused() for a in during if a.op == "create"), [(a.status, a.body[:200]) for a in during]
    slow = [a for a in during if a.seconds > FAST]
    assert not slow, [(a.op, a.status, round(a.seconds, 2)) for a in slow]

    tcp_proxy.restore()
    wait_until(lambda: episode(client, owner, right, answers) is not None, 60,
               "a full episode through the same gateway after the database answers again", interval=0.5)
    assert gateway.process.poll() is None and gateway.process.pid == pid
    wrong = [a for a in answers if a.status != 200 and not a.refused()]
    assert not wrong, [(a.op, a.status, a.body[:200]) for a in wrong]
    assert sessions.get(sid=kept).status in OPEN
