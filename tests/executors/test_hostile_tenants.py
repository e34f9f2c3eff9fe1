"""A hostile tenant on the embedded default (inline executor), with real sandbox workers: team B
(globex) publishes an environment whose import, setup, prompt and tools try to read the platform's
credentials, database, files and other teams' secrets, reach the network, patch code, write
outside their tmp, exit, exhaust memory and processes, and leave children behind. Every attempt
fails or is contained, while team A's (acme) concurrent episodes keep scoring correctly."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import re
import secrets
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from django.conf import settings

from orsplatform.asgi import build_application
from orsplatform.engine.gateway import EpisodeGateway
from orsplatform.executors.inline import InlineExecutor, checked
from orsplatform.ors.app import OrsApp
from orsplatform.sandbox import binding, gvisor
from orsplatform.sandbox.config import SandboxConfig, SandboxUnavailable
from tests.executors.hostile import CANARY_PATTERN, write_hostile
from tests.fixtures.ors import parse_sse, sse_result
from tests.ors.support import in_db, sid_headers, wait_for

# The modules of the platform a sandbox worker may hold: those binding.py binds, and their packages.
WORKER_HELD = {m.rsplit(".", i)[0] for m in binding.WORKER_MODULES for i in range(m.count(".") + 1)}

HOSTILE = "globex/hostile"
ALLOWED_ENV = {"PATH", "HOME", "LANG", "TMPDIR", "MALLOC_ARENA_MAX", "PWD"}


def canary() -> str:
    return "sbxcanary-" + secrets.token_hex(8)


# The hostile environment's tool timeout. Under gVisor's ptrace platform each system call costs tens
# of microseconds: the probes that make thousands (a memory scan, 500 forks) get the time they need.
HOSTILE_TIMEOUT = {"bwrap": 2.0, "gvisor": 15.0}


@pytest.fixture
async def hostile(outsider, tmp_path, runtime):
    from orsplatform.catalog.services import environment_publish

    write_hostile(tmp_path / "hostile", timeout=HOSTILE_TIMEOUT[runtime])
    version = await in_db(lambda: environment_publish(team=outsider.team, source_dir=tmp_path / "hostile").version)
    return version.package_path


def secret_header(values: dict[str, str]) -> dict[str, str]:
    import base64

    body = {k: {"value": v, "allowed_domains": []} for k, v in values.items()}
    return {"X-Secrets": base64.b64encode(json.dumps(body).encode()).decode()}


async def open_session(client, person, env: str, secret: str | None = None, spec: dict | None = None) -> str:
    headers = {**person.headers, **(secret_header({"api_key": secret}) if secret else {})}
    r = await client.post("/create_session", headers=headers)
    sid = r.json()["sid"]
    r = await client.post(f"/{env}/create", headers={**headers, "X-Session-ID": sid},
                          json={"task_spec": spec or {"id": 0}})
    assert r.status_code == 200, r.text
    # As clients do: "503 starting" (a worker still starting, Retry-After) is asked again.
    deadline = time.monotonic() + 180
    while (r := await client.get(f"/{env}/prompt", headers=sid_headers(person, sid))).status_code == 503 \
            and time.monotonic() < deadline:
        await asyncio.sleep(0.5)  # polling interval while the worker starts
    assert r.status_code == 200, r.text
    return sid


async def attempt(client, person, sid: str, what: str, arg: str = "", n: int = 0, env: str = HOSTILE) -> dict:
    r = await client.post(f"/{env}/call", headers=sid_headers(person, sid),
                          json={"name": "probe", "input": {"what": what, "arg": arg, "n": n}})
    assert r.status_code == 200, r.text
    result = sse_result(r.text)
    assert "sse_error" not in result, result
    assert "output" in result, result
    return json.loads(result["output"]["blocks"][0]["text"])


class TeamA:
    """Team A's episodes, run continuously beside the attack: each with a canary secret, each call's
    answer and reward checked (the probe's `count` doubles n and scores 0.5)."""

    def __init__(self, client, owner, env: str) -> None:
        self.client, self.owner, self.env = client, owner, env
        self.canaries: list[str] = []
        self.episodes = 0
        self.failures: list[str] = []
        self.call_seconds: list[float] = []
        self._task: asyncio.Task | None = None
        self._stop = asyncio.Event()

    async def episode(self, i: int) -> None:
        secret = canary()
        self.canaries.append(secret)
        sid = await open_session(self.client, self.owner, self.env, secret)
        for n in (i, i + 1):
            started = time.monotonic()
            r = await self.client.post(f"/{self.env}/call", headers=sid_headers(self.owner, sid),
                                       json={"name": "count", "input": {"n": n}})
            self.call_seconds.append(time.monotonic() - started)
            result = sse_result(r.text)
            if result.get("output", {}).get("blocks", [{}])[0].get("text") != str(2 * n) \
                    or result["output"].get("reward") != 0.5:
                self.failures.append(f"episode {i}: {result}")
        await self.client.post("/delete", headers=sid_headers(self.owner, sid))
        self.episodes += 1

    async def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            try:
                await self.episode(i)
            except Exception as exc:  # noqa: BLE001 - every failure is reported by check()
                self.failures.append(f"episode {i}: {type(exc).__name__}: {exc}")
            i += 1

    def __enter__(self) -> TeamA:
        self._task = asyncio.ensure_future(self._run())
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()

    async def check(self, at_least: int = 1) -> None:
        await wait_for(lambda: self.episodes >= at_least, timeout=60, what=f"{at_least} episodes of team A")
        self._stop.set()
        if self._task is not None:
            await asyncio.wait_for(self._task, 60)
        assert not self.failures, self.failures


def platform_secrets() -> list[str]:
    return [settings.SECRET_KEY, str(settings.DATABASES["default"]["NAME"])]


async def test_team_b_reads_nothing_of_the_platform_or_of_team_a(sbx, owner, outsider, hostile, probe_a):
    a_package = (await in_db(lambda: __import__("orsplatform.catalog.models", fromlist=["x"])
                             .EnvironmentVersion.objects.get(environment__slug="probe").package_path))
    with TeamA(sbx, owner, probe_a) as team_a:
        await wait_for(lambda: team_a.episodes >= 1, timeout=60, what="team A's first episode")
        b_canary = canary()
        sid = await open_session(sbx, outsider, HOSTILE, b_canary, spec={"id": 0, "peek": str(settings.BASE_DIR)})

        # What import, __init__ and setup saw (the prompt reports it).
        r = await sbx.get(f"/{HOSTILE}/prompt", headers=sid_headers(outsider, sid))
        seen = r.text
        for value in platform_secrets():
            assert value not in seen
        prompt = json.loads(r.json()[0]["text"])
        for stage in ("import", "init", "setup"):
            assert set(prompt[stage]["environ"]) <= ALLOWED_ENV, prompt[stage]["environ"]
        # The platform's tree: at most the empty mount points leading to the read-only virtualenv.
        peek = prompt["setup"]["peek"]
        assert peek["ok"] is False or set(peek["value"]) <= {".venv"}, peek

        environ = await attempt(sbx, outsider, sid, "environ")
        assert set(environ["value"]) <= ALLOWED_ENV

        # Other processes: only the sandbox's own are visible, and none holds a platform secret.
        procs = await attempt(sbx, outsider, sid, "proc")
        assert len(procs["value"]) <= 3, procs["value"].keys()
        assert f"/proc/{os.getpid()}" not in procs["value"] or os.getpid() <= 3
        dump = json.dumps(procs)
        for value in platform_secrets():
            assert value not in dump
        gateway = await attempt(sbx, outsider, sid, "read", f"/proc/{os.getpid()}/environ")
        assert gateway["ok"] is False or settings.SECRET_KEY not in gateway["value"]

        # Files: the database, var/, settings, the platform's tree, team A's package.
        db_path = str(settings.DATABASES["default"]["NAME"])
        for path in (db_path, str(settings.VAR_DIR), str(settings.BASE_DIR / "orsplatform" / "settings.py"),
                     str(settings.BASE_DIR), a_package, str(Path(a_package) / "env.py"),
                     str(settings.ORS_PACKAGE_DIR)):
            got = await attempt(sbx, outsider, sid, "read", path)
            assert got["ok"] is False, (path, got)
            listed = await attempt(sbx, outsider, sid, "listdir", path)
            assert listed["ok"] is False or set(listed["value"]) <= {".venv"}, (path, listed)

        # Writes: only its private tmp.
        for path in ("/ors/env/env.py", "/ors/env/new.py", str(Path(a_package) / "env.py"), "/usr/owned",
                     "/etc/owned", "/owned"):
            got = await attempt(sbx, outsider, sid, "write", path)
            assert got["ok"] is False, (path, got)
        assert (await attempt(sbx, outsider, sid, "write", "/tmp/mine"))["ok"] is True

        # Network: Redis, PostgreSQL, the outside world, and a port this test holds open (reachable
        # from the host's network, so only the sandbox's own network namespace refuses it).
        with socket.socket() as listener:
            listener.bind(("127.0.0.1", 0))
            listener.listen()
            for target in ("127.0.0.1:6379", "127.0.0.1:5432", "1.1.1.1:53",
                           f"127.0.0.1:{listener.getsockname()[1]}"):
                got = await attempt(sbx, outsider, sid, "connect", target)
                assert got["ok"] is False, (target, got)

        # Memory: its own canary is found (the search works), team A's never.
        found = (await attempt(sbx, outsider, sid, "scan"))["value"]
        assert b_canary in found
        assert not set(found) & set(team_a.canaries), found
        await team_a.check(at_least=2)
    assert all(re.fullmatch(CANARY_PATTERN, c) for c in team_a.canaries)


async def test_monkeypatching_changes_only_the_tenants_own_worker(sbx, owner, outsider, hostile, probe_a):
    sid = await open_session(sbx, outsider, HOSTILE)
    patched = (await attempt(sbx, outsider, sid, "patch"))["value"]
    # Of the platform a worker holds only the sandbox package's Django-free modules (binding.py:
    # the loader and redaction it shares), nothing that runs sessions; the rest is not importable.
    assert patched["executors"] == [] and set(patched["platform_modules"]) <= WORKER_HELD, patched
    assert patched["import"]["ok"] is False  # the platform's code is not even importable
    with TeamA(sbx, owner, probe_a) as team_a:
        await team_a.check(at_least=2)  # every reward 0.5, none the rigged 1.0
    from tests.ors.support import acalls

    rows = [c for c in await acalls() if c["name"] == "count"]
    assert rows and all(c["reward"] == 0.5 for c in rows)


async def test_os_exit_loses_only_the_workers_own_sessions(sbx, sandbox_app, owner, outsider, hostile, probe_a):
    with TeamA(sbx, owner, probe_a) as team_a:
        doomed = await open_session(sbx, outsider, HOSTILE)
        sibling = await open_session(sbx, outsider, HOSTILE)  # same (version, team): same worker
        r = await sbx.post(f"/{HOSTILE}/call", headers=sid_headers(outsider, doomed),
                           json={"name": "probe", "input": {"what": "exit"}})
        error = [d for e, d in parse_sse(r.text) if e == "error"]
        assert error and "globex/hostile@1" in error[0], r.text
        for sid in (doomed, sibling):
            r = await sbx.get(f"/{HOSTILE}/prompt", headers=sid_headers(outsider, sid))
            assert r.status_code == 410 and "globex/hostile@1" in r.json()["detail"], r.text
        fresh = await open_session(sbx, outsider, HOSTILE)  # a new worker serves the next session
        assert (await attempt(sbx, outsider, fresh, "environ"))["ok"] is True
        await team_a.check(at_least=2)


async def test_allocating_past_the_memory_limit_fails_inside_the_worker(sbx, owner, outsider, hostile, probe_a):
    sid = await open_session(sbx, outsider, HOSTILE)
    with TeamA(sbx, owner, probe_a) as team_a:
        got = await attempt(sbx, outsider, sid, "alloc", n=2048)  # 2 GiB against a 512 MiB manifest limit
        assert got["ok"] is False and "MemoryError" in got["error"]
        assert (await attempt(sbx, outsider, sid, "alloc", n=16))["ok"] is True  # and it carries on
        await team_a.check(at_least=2)


async def test_a_fork_bomb_is_bounded_and_its_children_end_with_the_worker(runtime, sbx, sandbox_app, owner,
                                                                           outsider, hostile, probe_a):
    sid = await open_session(sbx, outsider, HOSTILE)
    workers = [w for w in sandbox_app.gateway.executor.pool.workers() if w.label.startswith(HOSTILE)]
    with TeamA(sbx, owner, probe_a) as team_a:
        r = await sbx.post(f"/{HOSTILE}/call", headers=sid_headers(outsider, sid),
                           json={"name": "probe", "input": {"what": "forkbomb", "arg": "", "n": 500}})
        result = sse_result(r.text)
        if runtime == "gvisor" and "sse_error" in result:
            # Under gVisor each forked interpreter costs the Sentry memory of its own: the bomb may
            # meet the worker's memory wall before its process cap. Either wall ends it, alone.
            assert "memory limit" in result["sse_error"], result
            await team_a.check(at_least=2)
            await wait_for(lambda: not any(_alive(w.proc.pid) for w in workers), timeout=30,
                           what="the worker and its forked children to end")
            return
        got = json.loads(result["output"]["blocks"][0]["text"])["value"]
        assert got["stopped"] is not None and got["forked"] < 64, got  # the manifest's 64 processes
        await team_a.check(at_least=2)
    worker_pids = [w.proc.pid for w in workers]
    tree = [p for w in worker_pids for p in _descendants(w)]
    # The children are there while the worker lives (under gVisor as its kernel's tasks).
    assert len(tree if runtime == "bwrap" else sandbox_processes(workers)) > 30
    await sbx.post("/delete", headers=sid_headers(outsider, sid))
    # Retired when idle (1 s here): its pid namespace, forked children included, goes with it.
    await wait_for(lambda: not any(_alive(p) for p in worker_pids + tree), timeout=30,
                   what="the worker and its forked children to end")


async def test_a_setsid_child_does_not_outlive_its_session(runtime, live_db, outsider, hostile):
    # Workers idle for ten minutes before they retire here: the child must end with its session,
    # not with its worker.
    config = dataclasses.replace(SandboxConfig.from_settings(settings, threads=8), idle_seconds=600.0)
    app = OrsApp(gateway=EpisodeGateway(executor=InlineExecutor(threads=8, config=config)))
    transport = httpx.ASGITransport(app=build_application(app))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver", timeout=60) as client:
            sid = await open_session(client, outsider, HOSTILE)
            mark = f"{4000 + secrets.randbelow(1000)}.{secrets.randbelow(10**6):06d}"
            got = await attempt(client, outsider, sid, "setsid", mark)
            assert got["ok"] is True
            running = (lambda: _host_processes(f"sleep {mark}")) if runtime == "bwrap" else (
                lambda: sandbox_processes(app.gateway.executor.pool.workers()))
            await wait_for(running, timeout=10, what="the child to start")
            workers = [w.proc.pid for w in app.gateway.executor.pool.workers()]
            await client.post("/delete", headers=sid_headers(outsider, sid))
            await wait_for(lambda: not running(), timeout=30, what="the setsid child to end")
            # ...while its worker lives on for the next session of the pair.
            assert [w.proc.pid for w in app.gateway.executor.pool.workers()] == workers
            assert all(w.alive for w in app.gateway.executor.pool.workers())
    finally:
        await app.shutdown()


async def test_a_sync_sleep_in_an_async_tool_freezes_only_its_own_worker(runtime, sbx, owner, outsider, hostile,
                                                                         probe_a):
    sid = await open_session(sbx, outsider, HOSTILE)
    freeze = int(HOSTILE_TIMEOUT[runtime]) + 10  # well past the tool's timeout
    with TeamA(sbx, owner, probe_a) as team_a:
        await wait_for(lambda: team_a.episodes >= 1, timeout=60, what="team A's first episode")
        frozen = asyncio.ensure_future(sbx.post(f"/{HOSTILE}/call", headers=sid_headers(outsider, sid),
                                                json={"name": "freeze", "input": {"what": "", "n": freeze}}))
        before = len(team_a.call_seconds)
        await wait_for(lambda: len(team_a.call_seconds) >= before + 4, timeout=30, what="team A's calls")
        assert not frozen.done() or "timed out" in frozen.result().text
        r = await frozen  # the tool's 2 s timeout answers it; the worker is killed a grace period later
        assert sse_result(r.text)["reason"] == "timeout"
        await team_a.check(at_least=2)
        # Team A's calls while B's worker was frozen took nowhere near the freeze.
        assert max(team_a.call_seconds[before:before + 4]) < 5, team_a.call_seconds

    async def gone():
        r = await sbx.get(f"/{HOSTILE}/prompt", headers=sid_headers(outsider, sid))
        return r.status_code == 410 and "outlived its timeout" in r.text

    await wait_for(gone, timeout=30, what="the frozen worker to be killed")


async def test_a_tool_that_ignores_its_timeout_is_killed_with_its_worker(sbx, owner, outsider, hostile, probe_a):
    sid = await open_session(sbx, outsider, HOSTILE)
    with TeamA(sbx, owner, probe_a) as team_a:
        r = await sbx.post(f"/{HOSTILE}/call", headers=sid_headers(outsider, sid),
                           json={"name": "probe", "input": {"what": "spin"}})
        assert sse_result(r.text)["reason"] == "timeout"

        async def gone():
            r = await sbx.get(f"/{HOSTILE}/prompt", headers=sid_headers(outsider, sid))
            return r.status_code == 410 and "globex/hostile@1" in r.text

        await wait_for(gone, timeout=30, what="the spinning worker to be killed")
        await team_a.check(at_least=2)


async def test_a_public_environment_runs_in_separate_workers_per_calling_team(sbx, sandbox_app, owner, outsider,
                                                                              hostile):
    a_canary = canary()
    a_sid = await open_session(sbx, owner, HOSTILE, a_canary)  # team A uses B's public environment
    b_sid = await open_session(sbx, outsider, HOSTILE)
    workers = [w for w in sandbox_app.gateway.executor.pool.workers() if w.label.startswith(HOSTILE)]
    assert len(workers) == 2 and {w.key[1] for w in workers} == {owner.team.pk, outsider.team.pk}
    # B's own session cannot find A's secret anywhere it can look, though B wrote the code.
    found = (await attempt(sbx, outsider, b_sid, "scan"))["value"]
    assert a_canary not in found
    # (A's session, running B's code, holds it, as it must: it is A's own secret in A's worker.)
    assert a_canary in (await attempt(sbx, owner, a_sid, "scan"))["value"]


async def test_network_access_asked_for_by_a_manifest_needs_the_operator(sbx, outsider, tmp_path):
    from orsplatform.catalog.services import environment_publish

    write_hostile(tmp_path / "net", extra="network = true")
    (tmp_path / "net" / "manifest.toml").write_text(
        (tmp_path / "net" / "manifest.toml").read_text().replace('name = "hostile"', 'name = "netty"'))
    await in_db(lambda: environment_publish(team=outsider.team, source_dir=tmp_path / "net"))
    r = await sbx.post("/create_session", headers=outsider.headers)
    sid = r.json()["sid"]
    await sbx.post("/globex/netty/create", headers=sid_headers(outsider, sid), json={"task_spec": {"id": 0}})
    r = await sbx.get("/globex/netty/prompt", headers=sid_headers(outsider, sid))
    assert r.status_code == 500 and "network access" in r.text


def test_the_server_refuses_to_start_without_a_sandbox_unless_told(caplog):
    missing = dataclasses.replace(SandboxConfig.from_env(threads=1), bwrap="/nonexistent/bwrap")
    with pytest.raises(SandboxUnavailable, match="ORS_SANDBOX=none"):
        checked(missing)
    caplog.set_level(logging.WARNING)
    checked(missing.with_mode("none"))
    assert "tenants are NOT isolated" in caplog.text


def _alive(pid: int) -> bool:
    with contextlib.suppress(OSError):
        os.kill(pid, 0)
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
        return state != "Z"
    return False


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for d in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            ppid = int((d / "stat").read_text().split(")")[-1].split()[1])
            children.setdefault(ppid, []).append(int(d.name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def sandbox_processes(workers: list) -> list[int]:
    """What gVisor lists in the workers' sandboxes besides the worker itself (its init, pid 1): under
    gVisor a tenant's processes are its kernel's tasks, not host processes."""
    found = []
    for worker in workers:
        where = gvisor.container_of(worker.proc.pid)
        if where is None:
            continue
        listed = subprocess.run([gvisor.runsc_path(), "--root", where[0], "ps", "--format", "json", where[1]],
                                capture_output=True, timeout=30)
        found += [p for p in gvisor.pids_of(json.loads(listed.stdout or b"[]")) if p != 1]
    return found


def _host_processes(needle: str) -> list[int]:
    found = []
    for d in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            if needle in (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                found.append(int(d.name))
    return found
