"""The hostile tenant of test_hostile_tenants.py on the celery executor, with real processes (a
gateway, a runner node, its sandbox workers, Redis): team B's code reaches neither Redis nor the
runner's memory, team A's secrets cross Redis only sealed to the node, and B's os._exit loses B's
sessions only, while team A's episodes on the same node keep scoring correctly."""

from __future__ import annotations

import base64
import json
import secrets
import socket
import threading
from pathlib import Path

import httpx
import pytest

from orsplatform.catalog.services import environment_publish
from orsplatform.sandbox import binding
from tests.executors.hostile import write_hostile
from tests.fixtures.celery import wait_until
from tests.fixtures.ors import parse_sse, sse_result
from tests.ors.support import publish_probe_sync

# The modules of the platform a sandbox worker may hold: those binding.py binds, and their packages.
WORKER_HELD = {m.rsplit(".", i)[0] for m in binding.WORKER_MODULES for i in range(m.count(".") + 1)}

pytestmark = pytest.mark.e2e
HOSTILE = "globex/hostile"
ALLOWED_ENV = {"PATH", "HOME", "LANG", "TMPDIR", "MALLOC_ARENA_MAX", "PWD"}


def canary() -> str:
    return "sbxcanary-" + secrets.token_hex(8)


def secret_header(value: str) -> dict[str, str]:
    body = {"api_key": {"value": value, "allowed_domains": []}}
    return {"X-Secrets": base64.b64encode(json.dumps(body).encode()).decode()}


def open_session(base: str, person, env: str, secret: str | None = None) -> str:
    headers = {**person.headers, **(secret_header(secret) if secret else {})}
    sid = httpx.post(f"{base}/create_session", headers=headers).json()["sid"]
    r = httpx.post(f"{base}/{env}/create", headers={**headers, "X-Session-ID": sid},
                   json={"task_spec": {"id": 0}}, timeout=30)
    assert r.status_code == 200, r.text
    r = httpx.get(f"{base}/{env}/prompt", headers={**person.headers, "X-Session-ID": sid}, timeout=60)
    assert r.status_code == 200, r.text
    return sid


def attempt(base: str, person, sid: str, what: str, arg: str = "", n: int = 0) -> dict:
    r = httpx.post(f"{base}/{HOSTILE}/call", headers={**person.headers, "X-Session-ID": sid},
                   json={"name": "probe", "input": {"what": what, "arg": arg, "n": n}}, timeout=60)
    result = sse_result(r.text)
    assert "output" in result, result
    return json.loads(result["output"]["blocks"][0]["text"])


def team_a_episode(base: str, owner, env: str, secret: str, n: int) -> None:
    sid = open_session(base, owner, env, secret)
    r = httpx.post(f"{base}/{env}/call", headers={**owner.headers, "X-Session-ID": sid},
                   json={"name": "count", "input": {"n": n}}, timeout=60)
    result = sse_result(r.text)
    assert result["output"]["blocks"][0]["text"] == str(2 * n) and result["output"]["reward"] == 0.5, result
    httpx.post(f"{base}/delete", headers={**owner.headers, "X-Session-ID": sid})


@pytest.fixture
def published(owner, outsider, tmp_path) -> str:
    write_hostile(tmp_path / "hostile")
    environment_publish(team=outsider.team, source_dir=tmp_path / "hostile")
    return publish_probe_sync(owner.team, tmp_path / "a")


def test_team_b_reaches_neither_redis_nor_team_a_on_a_runner_node(cluster, server_factory, owner, outsider,
                                                                  published):
    runner = cluster.start_runner()
    gateway = server_factory(**cluster.env())
    base = gateway.url

    # Team A's secret crosses Redis sealed: a MONITOR on the broker sees the setup message, not it.
    a_canary = canary()
    seen: list[str] = []
    monitor_ready = threading.Event()
    stop = threading.Event()

    def watch() -> None:
        with cluster.redis.monitor() as m:
            monitor_ready.set()
            for command in m.listen():
                seen.append(command["command"])
                if stop.is_set():
                    return

    threading.Thread(target=watch, daemon=True).start()
    monitor_ready.wait(10)
    a_sid = open_session(base, owner, published, a_canary)
    stop.set()
    cluster.redis.ping()  # one more command ends the monitor loop
    assert any("runners.node.setup" in c or "lpush" in c.lower() for c in seen)
    assert not any(a_canary in c for c in seen), "a secret crossed Redis in clear"

    b_canary = canary()
    b_sid = open_session(base, outsider, HOSTILE, b_canary)
    environ = attempt(base, outsider, b_sid, "environ")["value"]
    assert not {"REDIS_URL", "CELERY_BROKER_URL", "ORS_REDIS_PREFIX"} & set(environ), environ
    assert attempt(base, outsider, b_sid, "connect", "127.0.0.1:6379")["ok"] is False
    runner_pid = cluster.heartbeat_pid(runner)
    got = attempt(base, outsider, b_sid, "read", f"/proc/{runner_pid}/environ")
    assert got["ok"] is False or cluster.redis_url not in got["value"]
    found = attempt(base, outsider, b_sid, "scan")["value"]
    assert b_canary in found and a_canary not in found

    # os._exit takes B's worker only: the node and team A's session on it carry on.
    r = httpx.post(f"{base}/{HOSTILE}/call", headers={**outsider.headers, "X-Session-ID": b_sid},
                   json={"name": "probe", "input": {"what": "exit"}}, timeout=60)
    errors = [d for e, d in parse_sse(r.text) if e == "error"]
    assert errors and "globex/hostile@1" in errors[0], r.text

    def answers_410() -> bool:
        r = httpx.get(f"{base}/{HOSTILE}/prompt", headers={**outsider.headers, "X-Session-ID": b_sid}, timeout=30)
        return r.status_code == 410 and "globex/hostile@1" in r.text

    wait_until(answers_410, 15, "B's lost session to answer 410 naming its environment")
    assert cluster.heartbeat_pid(runner) == runner_pid
    r = httpx.post(f"{base}/{published}/call", headers={**owner.headers, "X-Session-ID": a_sid},
                   json={"name": "count", "input": {"n": 4}}, timeout=60)
    assert sse_result(r.text)["output"]["reward"] == 0.5
    for n in range(3):
        team_a_episode(base, owner, published, canary(), n)
    fresh = open_session(base, outsider, HOSTILE)  # a fresh worker for B's next session
    assert attempt(base, outsider, fresh, "environ")["ok"] is True
    wait_until(lambda: cluster.heartbeat_pid(runner) == runner_pid, 5, "the node is still the same process")


def test_on_a_runner_node_runaway_tools_and_forks_stay_in_their_worker(cluster, server_factory, owner, outsider,
                                                                       published):
    runner = cluster.start_runner()
    gateway = server_factory(**cluster.env())
    base = gateway.url
    runner_pid = cluster.heartbeat_pid(runner)
    sid = open_session(base, outsider, HOSTILE)

    # Bounded: the manifest's 64 processes (threads included).
    bomb = attempt(base, outsider, sid, "forkbomb", n=500)["value"]
    assert bomb["stopped"] is not None and bomb["forked"] < 64, bomb
    assert attempt(base, outsider, sid, "alloc", n=2048)["ok"] is False  # past its 512 MiB

    # A sync tool spinning past its 2 s timeout: answered "timeout", then its worker is killed.
    r = httpx.post(f"{base}/{HOSTILE}/call", headers={**outsider.headers, "X-Session-ID": sid},
                   json={"name": "probe", "input": {"what": "spin"}}, timeout=60)
    assert sse_result(r.text)["reason"] == "timeout"

    def lost() -> bool:
        r = httpx.get(f"{base}/{HOSTILE}/prompt", headers={**outsider.headers, "X-Session-ID": sid}, timeout=30)
        return r.status_code == 410 and "outlived its timeout" in r.text

    wait_until(lost, 30, "the spinning worker to be killed and its session to answer 410")
    for n in range(2):  # the node, and team A's sessions on it, carry on
        team_a_episode(base, owner, published, canary(), n)
    assert cluster.heartbeat_pid(runner) == runner_pid


class TeamAThread:
    """Team A's episodes on the same runner node, run continuously in a thread beside the attack,
    each with a canary secret and every answer and reward checked."""

    def __init__(self, base: str, owner, env: str) -> None:
        self.base, self.owner, self.env = base, owner, env
        self.episodes, self.failures, self.canaries = 0, [], []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            secret = canary()
            self.canaries.append(secret)
            try:
                team_a_episode(self.base, self.owner, self.env, secret, n)
                self.episodes += 1
            except Exception as exc:  # noqa: BLE001 - every failure is reported by check()
                self.failures.append(f"episode {n}: {type(exc).__name__}: {exc}")
            n += 1

    def __enter__(self) -> TeamAThread:
        self._thread.start()
        wait_until(lambda: self.episodes >= 1 or self.failures, 60, "team A's first episode")
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(60)

    def check(self, at_least: int) -> None:
        wait_until(lambda: self.episodes >= at_least or self.failures, 60, f"{at_least} episodes of team A")
        assert not self.failures, self.failures


def test_on_a_runner_node_team_b_reads_writes_and_reaches_nothing_while_team_a_scores(
        cluster, server_factory, owner, outsider, published):
    from django.conf import settings as django_settings

    from orsplatform.catalog.models import EnvironmentVersion

    runner = cluster.start_runner()
    gateway = server_factory(**cluster.env())
    base = gateway.url
    runner_pid = cluster.heartbeat_pid(runner)
    a_package = EnvironmentVersion.objects.get(environment__slug="probe").package_path
    listener = socket.socket()  # a port this test owns: reachable from the host's network, not from B's
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    try:
        with TeamAThread(base, owner, published) as team_a:
            b_canary = canary()
            sid = open_session(base, outsider, HOSTILE, b_canary)
            # What import, __init__ and setup saw (the prompt reports it).
            prompt = httpx.get(f"{base}/{HOSTILE}/prompt", headers={**outsider.headers, "X-Session-ID": sid},
                               timeout=30).json()
            seen = json.loads(prompt[0]["text"])
            for stage in ("import", "init", "setup"):
                assert set(seen[stage]["environ"]) <= ALLOWED_ENV, seen[stage]["environ"]

            # Other processes: only the sandbox's own; not the node's command line nor its environment.
            procs = attempt(base, outsider, sid, "proc")["value"]
            assert len(procs) <= 3, procs.keys()
            assert cluster.redis_url not in json.dumps(procs) and cluster.prefix not in json.dumps(procs)
            for what in ("environ", "cmdline"):
                got = attempt(base, outsider, sid, "read", f"/proc/{runner_pid}/{what}")
                assert got["ok"] is False or (cluster.prefix not in got["value"] and runner not in got["value"]), got

            # Files: the platform's tree and settings, var/, the packages, team A's code.
            for path in (str(django_settings.BASE_DIR / "orsplatform" / "settings.py"), str(django_settings.BASE_DIR),
                         str(django_settings.VAR_DIR), str(django_settings.ORS_PACKAGE_DIR), a_package,
                         str(Path(a_package) / "env.py")):
                got = attempt(base, outsider, sid, "read", path)
                assert got["ok"] is False, (path, got)
                listed = attempt(base, outsider, sid, "listdir", path)
                assert listed["ok"] is False or set(listed["value"]) <= {".venv"}, (path, listed)
            for path in ("/ors/env/env.py", str(Path(a_package) / "env.py"), "/usr/owned", "/owned"):
                assert attempt(base, outsider, sid, "write", path)["ok"] is False, path
            assert attempt(base, outsider, sid, "write", "/tmp/mine")["ok"] is True

            # Network: Redis, PostgreSQL, the gateway, a port of the host's that is surely open.
            gateway_port = base.rsplit(":", 1)[1]
            for target in ("127.0.0.1:6379", "127.0.0.1:5432", f"127.0.0.1:{gateway_port}",
                           f"127.0.0.1:{listener.getsockname()[1]}"):
                assert attempt(base, outsider, sid, "connect", target)["ok"] is False, target

            # Monkeypatching reaches only B's own worker: team A's rewards stay 0.5 (checked per call).
            patched = attempt(base, outsider, sid, "patch")["value"]
            # Of the platform a worker holds only the sandbox package's Django-free modules (binding.py:
            # the loader and redaction it shares), nothing that runs sessions; the rest is not importable.
            assert patched["executors"] == [] and set(patched["platform_modules"]) <= WORKER_HELD, patched
            assert patched["import"]["ok"] is False

            # Memory: B finds its own canary (the search works), never one of team A's.
            found = attempt(base, outsider, sid, "scan")["value"]
            assert b_canary in found and not set(found) & set(team_a.canaries), found

            # A setsid child ends with B's session, not whenever the worker retires.
            mark = f"{5000 + secrets.randbelow(1000)}.{secrets.randbelow(10**6):06d}"
            assert attempt(base, outsider, sid, "setsid", mark)["ok"] is True
            wait_until(lambda: _host_processes(f"sleep {mark}"), 10, "B's child to start")
            httpx.post(f"{base}/delete", headers={**outsider.headers, "X-Session-ID": sid})
            wait_until(lambda: not _host_processes(f"sleep {mark}"), 10, "B's setsid child to end")
            team_a.check(at_least=team_a.episodes + 2)
    finally:
        listener.close()
    assert cluster.heartbeat_pid(runner) == runner_pid


def _host_processes(needle: str) -> list[int]:
    """Pids of this machine's processes whose command line contains `needle`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if needle in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found
