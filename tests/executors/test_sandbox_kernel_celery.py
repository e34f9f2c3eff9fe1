"""The sandbox's kernel-side walls of test_sandbox_kernel.py on the celery executor, with real
processes (a gateway, a runner node, its sandbox workers, Redis): on a runner node, file locks
between two teams' workers fail, the refused syscalls are refused, forked children over the memory
limit end only their worker (with the reason), and a stray child outliving a replaced clean-up is
killed when its session ends, while team A's episodes on the same node keep scoring."""

from __future__ import annotations

import errno
import json
import secrets

import httpx
import pytest

from orsplatform.catalog.services import environment_publish
from tests.executors.kernel_env import write_kernel_env
from tests.executors.test_hostile_tenants import _host_processes
from tests.executors.test_hostile_tenants_celery import TeamAThread, open_session
from tests.fixtures.celery import wait_until
from tests.fixtures.ors import sse_result
from tests.ors.support import publish_probe_sync

pytestmark = pytest.mark.e2e
KERNEL = "globex/kernel"
REFUSED = ("ptrace", "process_vm_readv", "unshare", "mount", "bpf", "io_uring_setup", "perf_event_open", "keyctl")


def probe(base: str, person, sid: str, what: str, arg: str = "", n: int = 0, m: int = 0):
    r = httpx.post(f"{base}/{KERNEL}/call", headers={**person.headers, "X-Session-ID": sid},
                   json={"name": "probe", "input": {"what": what, "arg": arg, "n": n, "m": m}}, timeout=60)
    result = sse_result(r.text)
    assert "output" in result, result
    return json.loads(result["output"]["blocks"][0]["text"])


def sleeping(mark: str) -> bool:
    return bool(_host_processes(f"sleep {mark}"))


@pytest.fixture
def published(owner, outsider, tmp_path) -> str:
    write_kernel_env(tmp_path / "kernel")
    environment_publish(team=outsider.team, source_dir=tmp_path / "kernel")
    return publish_probe_sync(owner.team, tmp_path / "a")


def test_on_a_runner_node_locks_syscalls_memory_and_strays_are_walled_in_while_team_a_scores(
        cluster, server_factory, owner, outsider, published):
    runner = cluster.start_runner()
    gateway = server_factory(**cluster.env())
    base = gateway.url
    runner_pid = cluster.heartbeat_pid(runner)
    with TeamAThread(base, owner, published) as team_a:
        in_a = open_session(base, owner, KERNEL)  # globex's public environment in team A's worker
        in_m = open_session(base, outsider, KERNEL)  # ...and in globex's own
        for person, sid in ((owner, in_a), (outsider, in_m)):
            tried = probe(base, person, sid, "locks")
            for kind in ("flock", "fcntl", "ofd", "ofd_get", "raw_ofd_high", "raw_setlk_high"):
                assert tried[kind]["ok"] is False and tried[kind]["errno"] == errno.ENOSYS, (kind, tried)
            assert probe(base, person, sid, "proc_locks")["ok"] is False
        for name in REFUSED:
            assert probe(base, outsider, in_m, "syscall", name) == {"result": -1, "errno": errno.EPERM}, name

        # A stray child whose worker's clean-up was replaced: gone once its session ends.
        mark = f"{6000 + secrets.randbelow(1000)}.{secrets.randbelow(10**6):06d}"
        stray_session = open_session(base, outsider, KERNEL)
        probe(base, outsider, stray_session, "stray", mark)
        wait_until(lambda: sleeping(mark), 30, "the stray child to start")
        for sid in (stray_session, in_m):
            httpx.post(f"{base}/delete", headers={**outsider.headers, "X-Session-ID": sid})
        wait_until(lambda: not sleeping(mark), 30, "the stray child to be killed with its session")

        # Three 500 MiB children against 1 GiB: the worker ends, with the reason, and only it.
        doomed = open_session(base, outsider, KERNEL)
        assert len(probe(base, outsider, doomed, "hog", n=500, m=3)) == 3

        def ended() -> bool:
            r = httpx.get(f"{base}/{KERNEL}/prompt", headers={**outsider.headers, "X-Session-ID": doomed}, timeout=30)
            return r.status_code == 410 and "memory limit of 1024 MiB" in r.text

        wait_until(ended, 60, "the worker to be ended for its memory")
        assert probe(base, owner, in_a, "fds")  # team A's worker of the same package carries on
        team_a.check(at_least=team_a.episodes + 2)
    assert cluster.heartbeat_pid(runner) == runner_pid
