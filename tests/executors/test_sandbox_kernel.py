"""The sandbox's kernel-side walls (issue #23, findings 2, 4, 6, 7) on the embedded default, with
real bubblewrap workers: no file locks between workers (nor /proc/locks), the refused syscalls,
one cgroup per worker (memory across forked children and tmpfs, pids, CPU weight), a sized /dev
and /dev/shm, strays killed from outside, no inherited descriptors under uvloop, and no host path
in what the sandbox shows of itself. Team A's concurrent episodes keep scoring throughout."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import secrets
import sys
from pathlib import Path

import httpx
from django.conf import settings

from orsplatform.asgi import build_application
from orsplatform.engine.gateway import EpisodeGateway
from orsplatform.executors.executor import SessionSpec
from orsplatform.executors.inline import InlineExecutor
from orsplatform.ors.app import OrsApp
from orsplatform.sandbox.config import MiB, SandboxConfig
from tests.executors.test_hostile_tenants import TeamA, _host_processes, open_session, sandbox_processes
from tests.fixtures.ors import sse_result
from tests.ors.support import in_db, sid_headers, wait_for

KERNEL = "globex/kernel"
REFUSED = ("ptrace", "process_vm_readv", "unshare", "mount", "bpf", "io_uring_setup", "perf_event_open", "keyctl")


async def probe(client, person, sid: str, what: str, arg: str = "", n: int = 0, m: int = 0, env: str = KERNEL):
    r = await client.post(f"/{env}/call", headers=sid_headers(person, sid),
                          json={"name": "probe", "input": {"what": what, "arg": arg, "n": n, "m": m}})
    assert r.status_code == 200, r.text
    result = sse_result(r.text)
    assert "output" in result, result
    return json.loads(result["output"]["blocks"][0]["text"])


def host_folders() -> list[str]:
    """Host folders whose names tenant code must not learn: the checkout, the virtualenv, the
    interpreter's prefix, the package store and the built environments."""
    folders = {settings.BASE_DIR, sys.prefix, sys.base_prefix, settings.ORS_PACKAGE_DIR, settings.ORS_PYENV_DIR}
    return sorted({os.path.realpath(f) for f in folders} - {"/", "/usr"})


async def assert_mount_tables_name_no_host_folder(client, person, sid: str, env: str = KERNEL) -> None:
    """Not as mount points nor as a mount's source (mountinfo's root field: a bind names its
    source's path on its filesystem), under either runtime."""
    for path in ("/proc/self/mountinfo", "/proc/self/mounts", "/proc/1/mountinfo"):
        got = await probe(client, person, sid, "read", path, env=env)
        assert got["ok"] is True, (path, got)
        leaked = [f for f in host_folders() if f in got["value"]]
        assert not leaked, (path, leaked, got["value"])


def workers_of(app: OrsApp, label: str) -> list:
    return [w for w in app.gateway.executor.pool.workers() if w.label.startswith(label)]


async def test_file_locks_on_shared_files_fail_in_every_teams_worker_while_team_a_scores(
        runtime, sbx, sandbox_app, owner, outsider, kernel_env, probe_a):
    with TeamA(sbx, owner, probe_a) as team_a:
        # Team A runs globex's public environment in A's worker; globex runs it in its own.
        in_a = await open_session(sbx, owner, KERNEL)
        in_m = await open_session(sbx, outsider, KERNEL)
        assert len({id(w) for w in workers_of(sandbox_app, KERNEL)}) == 2
        if runtime == "gvisor":
            # Locks are gVisor's, kept in each sandbox's own kernel: an exclusive lock held in A's
            # worker is not seen from globex's, nor in the host's lock table.
            for person, sid in ((owner, in_a), (outsider, in_m)):
                held = await probe(sbx, person, sid, "hold_lock")
                assert held["ok"] is True, held
            shared = os.stat(os.path.realpath(os.__file__))
            with open("/proc/locks") as f:
                assert f":{shared.st_ino} " not in f.read()
            await team_a.check(at_least=2)
            return
        for person, sid in ((owner, in_a), (outsider, in_m)):
            tried = await probe(sbx, person, sid, "locks")
            for kind in ("flock", "fcntl", "ofd", "ofd_get", "raw_ofd_high", "raw_setlk_high"):
                assert tried[kind]["ok"] is False and tried[kind]["errno"] == errno.ENOSYS, (kind, tried)
            seen = await probe(sbx, person, sid, "proc_locks")
            assert seen["ok"] is False or seen["value"] == "", seen
        await team_a.check(at_least=2)


async def test_ptrace_process_vm_user_namespaces_mount_bpf_io_uring_perf_and_keyctl_are_refused(
        sbx, outsider, kernel_env):
    sid = await open_session(sbx, outsider, KERNEL)
    for name in REFUSED:
        got = await probe(sbx, outsider, sid, "syscall", name)
        assert got == {"result": -1, "errno": errno.EPERM}, (name, got)
    # ...while what Python needs still works: threads and a child interpreter.
    assert (await probe(sbx, outsider, sid, "threads"))["ok"] is True


async def test_sqlite_on_a_tmp_file_fails_at_once_and_works_without_locking(runtime, sbx, outsider, kernel_env):
    sid = await open_session(sbx, outsider, KERNEL)
    locked = await probe(sbx, outsider, sid, "sqlite", "/tmp/locked.db")
    if runtime == "gvisor":  # gVisor's locks are the sandbox's own: SQLite works as anywhere
        assert locked["ok"] is True, locked
        return
    assert locked["ok"] is False and "OperationalError" in locked["error"] and locked["seconds"] < 3, locked
    free = await probe(sbx, outsider, sid, "sqlite", "file:/tmp/free.db?nolock=1")
    assert free["ok"] is True, free


async def test_forked_children_over_the_memory_limit_end_the_worker_with_a_reason_not_others(
        sbx, sandbox_app, owner, outsider, kernel_env, probe_a):
    with TeamA(sbx, owner, probe_a) as team_a:
        bystander = await open_session(sbx, owner, KERNEL)  # the same package in team A's worker
        doomed = await open_session(sbx, outsider, KERNEL)
        sibling = await open_session(sbx, outsider, KERNEL)
        # Three children of 500 MiB each against the manifest's 1 GiB: each is under the
        # per-process limit, together they are not.
        pids = await probe(sbx, outsider, doomed, "hog", n=500, m=3)
        assert len(pids) == 3

        async def ended() -> bool:
            r = await sbx.get(f"/{KERNEL}/prompt", headers=sid_headers(outsider, sibling))
            return r.status_code == 410 and "memory limit of 1024 MiB" in r.json()["detail"]

        await wait_for(ended, timeout=60, what="the worker to be ended for its memory")
        r = await sbx.get(f"/{KERNEL}/prompt", headers=sid_headers(outsider, doomed))
        assert r.status_code == 410 and "globex/kernel@1" in r.json()["detail"], r.text
        assert (await probe(sbx, owner, bystander, "fds")) is not None  # team A's worker unaffected
        await team_a.check(at_least=2)


# Read-only places refuse writes with EROFS under bubblewrap; gVisor checks the folder's owner first
# (root's, not the tenant's) and says EACCES.
READ_ONLY = {"bwrap": (errno.EROFS,), "gvisor": (errno.EROFS, errno.EACCES)}


async def test_writing_past_the_cap_into_dev_or_dev_shm_fails(runtime, sbx, outsider, kernel_env):
    sid = await open_session(sbx, outsider, KERNEL)
    into_dev = await probe(sbx, outsider, sid, "fill", "/dev/blob", n=1)
    assert into_dev["ok"] is False and into_dev["errno"] in READ_ONLY[runtime], into_dev
    assert (await probe(sbx, outsider, sid, "fill", "/dev/shm/small", n=8))["ok"] is True  # under the cap: fine
    into_shm = await probe(sbx, outsider, sid, "fill", "/dev/shm/blob", n=100)  # the manifest's tmp_mb is 64
    assert into_shm["ok"] is False and into_shm["errno"] == errno.ENOSPC, into_shm
    assert (await probe(sbx, outsider, sid, "fill", "/tmp/blob", n=100))["errno"] == errno.ENOSPC


async def test_each_worker_has_its_own_cgroup_with_memory_pids_and_cpu_weight_removed_when_it_ends(
        live_db, outsider, kernel_env):
    config = dataclasses.replace(SandboxConfig.from_settings(settings, threads=4), cpu_weight=50)
    executor = InlineExecutor(threads=4, config=config)
    try:
        await executor.start(SessionSpec(sid="k1", package_path=kernel_env, entrypoint="env:Kernel", task_spec={},
                                         owner={"team": 1, "env": "globex/kernel@1"}))
        await executor.wait_ready("k1", 60)
        (worker,) = executor.pool.workers()
        group = worker._cgroup
        assert group is not None
        members = group.pids()
        assert worker.proc.pid in members and len(members) >= 3  # bubblewrap, its init, the worker
        if group.version == 1:
            assert int(group.read("cpu", "cpu.shares")) == 512
            # All workers together weigh a quarter of one platform process (ORS_SANDBOX_TOTAL_CPU_WEIGHT).
            assert int((group.paths["cpu"].parent / "cpu.shares").read_text()) == 256
            assert int(group.read("memory", "memory.limit_in_bytes")) == 1024 * MiB
            assert int(group.read("pids", "pids.max")) == config.defaults.processes
        else:
            assert int(group.read("cpu", "cpu.weight")) == 50
            assert int((group.paths["unified"].parent / "cpu.weight").read_text()) == 25
            assert int(group.read("memory", "memory.max")) == 1024 * MiB
        paths = list(group.paths.values())
        await executor.stop("k1")
        worker.kill("the test is over")
        await wait_for(lambda: not any(p.exists() for p in paths), timeout=30, what="the cgroup to be removed")
    finally:
        await executor.close()


def _sandbox_processes(app: OrsApp, runtime: str, mark: str) -> list:
    """The stray, as the host sees it (bubblewrap) or as gVisor lists its own tasks."""
    if runtime == "bwrap":
        return _host_processes(f"sleep {mark}")
    return sandbox_processes(app.gateway.executor.pool.workers())


async def test_a_stray_child_is_gone_after_its_session_ends_even_when_tenant_code_replaced_the_clean_up(
        runtime, live_db, outsider, kernel_env):
    config = dataclasses.replace(SandboxConfig.from_settings(settings, threads=8), idle_seconds=600.0)
    app = OrsApp(gateway=EpisodeGateway(executor=InlineExecutor(threads=8, config=config)))
    transport = httpx.ASGITransport(app=build_application(app))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver", timeout=60) as client:
            sid = await open_session(client, outsider, KERNEL)
            mark = f"{5000 + secrets.randbelow(1000)}.{secrets.randbelow(10**6):06d}"
            await probe(client, outsider, sid, "stray", mark)
            await wait_for(lambda: _sandbox_processes(app, runtime, mark), timeout=10, what="the child to start")
            workers = [w.proc.pid for w in app.gateway.executor.pool.workers()]
            await client.post("/delete", headers=sid_headers(outsider, sid))
            if runtime == "bwrap":
                await wait_for(lambda: not _sandbox_processes(app, runtime, mark), timeout=30, what="the stray to end")
            else:
                # gVisor lists a killed child until the worker reaps it (which the replaced clean-up
                # no longer does): the next session of the worker sees no such process running.
                later = await open_session(client, outsider, KERNEL)

                async def ended() -> bool:
                    return not [c for c in await probe(client, outsider, later, "commands") if mark in c]

                await wait_for(ended, timeout=30, what="the stray to end")
            assert [w.proc.pid for w in app.gateway.executor.pool.workers()] == workers  # the worker lives on
            assert all(w.alive for w in app.gateway.executor.pool.workers())
    finally:
        await app.shutdown()


async def test_a_child_left_by_one_key_never_meets_another_keys_session_of_the_same_team(
        runtime, sbx, sandbox_app, outsider, kernel_env):
    """Red team three's last tenant finding: a child left by tenant code lived on into a later session
    of the same environment and team while the worker had other sessions. Each API key's sessions
    have workers of their own (pool.py), so another key of the team never shares its processes."""
    from orsplatform.teams.services import api_key_create

    other = await in_db(lambda: api_key_create(team=outsider.team, name="second-trainer").token)
    second = type(outsider)(outsider.username, outsider.team, outsider.role, other)
    first_sid = await open_session(sbx, outsider, KERNEL)
    still_open = await open_session(sbx, outsider, KERNEL)  # the first key's worker stays busy
    mark = f"{5000 + secrets.randbelow(1000)}.{secrets.randbelow(10**6):06d}"
    await probe(sbx, outsider, first_sid, "stray", mark)
    await sbx.post("/delete", headers=sid_headers(outsider, first_sid))
    later = await open_session(sbx, second, KERNEL)
    seen = await probe(sbx, second, later, "commands")
    assert seen and not [c for c in seen if mark in c], seen
    assert len({id(w) for w in workers_of(sandbox_app, KERNEL)}) == 2  # one per key
    # The first key's own later session still shares its worker (and its leftovers: its own code).
    mine = await probe(sbx, outsider, still_open, "commands")
    assert [c for c in mine if mark in c], mine


def test_no_descriptor_of_the_gateway_reaches_a_worker_under_uvloop(kernel_env):
    import uvloop

    leaked_r, leaked_w = os.pipe()
    os.set_inheritable(leaked_r, True)  # as a socket-activated listener or uvicorn --fd would be
    os.set_inheritable(leaked_w, True)

    async def run() -> list[int]:
        executor = InlineExecutor(threads=4, config=SandboxConfig.from_settings(settings, threads=4))
        try:
            await executor.start(SessionSpec(sid="u1", package_path=kernel_env, entrypoint="env:Kernel",
                                             task_spec={}, owner={"team": 1, "env": "globex/kernel@1"}))
            await executor.wait_ready("u1", 60)
            outcome = await executor.call("u1", "probe", {"what": "fds"}, timeout=30)
            return json.loads(outcome.result["output"]["blocks"][0]["text"])
        finally:
            await executor.close()

    try:
        fds = uvloop.run(run())
    finally:
        os.close(leaked_r)
        os.close(leaked_w)
    # stdin (/dev/null), stdout (stderr), stderr, the protocol's two pipe ends, the listing's own fd,
    # and what the worker's event loop and thread pool opened for themselves: nothing inherited.
    assert leaked_r not in fds and leaked_w not in fds, fds
    assert max(fds) < 16, fds


async def test_the_sandbox_shows_no_host_path_in_its_command_lines_environments_or_mount_points(
        runtime, sbx, outsider, kernel_env):
    sid = await open_session(sbx, outsider, KERNEL)
    checkout = str(Path(settings.BASE_DIR).resolve())
    host_paths = [checkout, str(Path(kernel_env).resolve()), os.path.realpath(os.sys.prefix)]
    for path in ("/proc/1/cmdline", "/proc/1/environ", "/proc/self/cmdline", "/proc/self/environ"):
        got = await probe(sbx, outsider, sid, "read", path)
        if path.startswith("/proc/1/") and not got["ok"]:
            # bubblewrap's init is the namespace's root, not the tenant's user: closed to it.
            assert got["errno"] == errno.EACCES, (path, got)
            continue
        assert got["ok"] is True, (path, got)
        assert not any(h in got["value"] for h in host_paths), (path, got["value"])
    mountinfo = await probe(sbx, outsider, sid, "read", "/proc/self/mountinfo")
    mount_points = [line.split()[4] for line in mountinfo["value"].splitlines()]
    assert "/ors/venv/lib" in mount_points
    assert not [m for m in mount_points if any(m.startswith(h) for h in host_paths)], mount_points
    # A small package is copied in, not bound: not even a mount's source names the package store.
    assert str(Path(kernel_env).resolve()) not in mountinfo["value"]
    await assert_mount_tables_name_no_host_folder(sbx, outsider, sid)
    assert "/ors/env" not in mount_points
    listed = await probe(sbx, outsider, sid, "read", "/ors/env/manifest.toml")
    assert listed["ok"] is True and 'entrypoint = "env:Kernel"' in listed["value"]
    written = await probe(sbx, outsider, sid, "fill", "/ors/env/env.py", n=1)
    assert written["ok"] is False and written["errno"] in READ_ONLY[runtime], written
