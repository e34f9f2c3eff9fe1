"""Red team, round three (issue #40), findings 1 and 2, with real sandbox workers as root: tenant code
is never the host's root (an unused host uid of the sandbox's own, no capabilities), no file under
/proc/sys or /sys opens for writing, the files every worker shares are not the tenant's, and the
page cache of a shared file is no channel between two callers' workers (mincore and cachestat
refused). Parametrised by runtime: bubblewrap today; gVisor joins the list with its runtime."""

from __future__ import annotations

import errno
import os

from orsplatform.sandbox import users
from tests.executors.kernel_env import write_kernel_env
from tests.executors.test_hostile_tenants import open_session
from tests.executors.test_sandbox_kernel import (
    KERNEL,
    assert_mount_tables_name_no_host_folder,
    probe,
    workers_of,
)
from tests.ors.support import in_db

KERNEL_FILES = "/proc,/sys"  # every kernel file of /proc (not the processes' own) and /sys


async def test_tenant_code_is_an_unused_host_uid_without_capabilities(runtime, sbx, outsider, kernel_env):
    sid = await open_session(sbx, outsider, KERNEL)
    seen = await probe(sbx, outsider, sid, "owners")
    if runtime == "bwrap":
        assert (seen["uid"], seen["gid"]) == (users.SANDBOX_UID, users.SANDBOX_UID), seen
        lines = [line.split() for line in seen["uid_map"].strip().splitlines()]
        # The namespace's root is the host's (bubblewrap mounts as it, then setpriv leaves it); the
        # tenant's user is one host uid of the unused range, which no host file belongs to.
        assert lines[0] == ["0", "0", "1"] and len(lines) == 2, lines
        inside, host, count = (int(x) for x in lines[1])
        assert (inside, count) == (users.SANDBOX_UID, 1) and users.UID_BASE < host < users.UID_BASE + 2**22, lines
    else:
        # gVisor's kernel has its own users: tenant code is the host uid its files are written as
        # (what a build writes belongs to it on the host too), one of the unused range.
        assert seen["uid"] == seen["gid"] and users.UID_BASE < seen["uid"] < users.UID_BASE + 2**22, seen
    assert seen["groups"] in ([], [seen["gid"]]), seen
    status = dict(line.split(":\t", 1) for line in seen["status"].splitlines() if ":\t" in line)
    # gVisor's status has no CapAmb line (nor ambient capabilities to show).
    for caps in ("CapInh", "CapPrm", "CapEff", "CapBnd", *(("CapAmb",) if runtime == "bwrap" else ())):
        assert int(status[caps], 16) == 0, (caps, status[caps])
    assert seen["no_new_privs"] == 1, seen
    # Every file the workers share belongs to someone else.
    assert seen["owners"] and all(owner != seen["uid"] for owner in seen["owners"].values()), seen["owners"]


async def test_tenant_code_sees_gvisors_kernel_under_gvisor_and_the_hosts_under_bubblewrap(
        runtime, sbx, outsider, kernel_env):
    sid = await open_session(sbx, outsider, KERNEL)
    seen = await probe(sbx, outsider, sid, "kernel")
    host = os.uname().release
    with open("/proc/version") as f:
        host_version = f.read()
    if runtime == "gvisor":
        # gVisor answers uname and /proc/version itself (it reports a Linux 4.4.0 of its own): the
        # host's kernel is neither named nor reached.
        assert seen["release"] != host and seen["version"] != host_version, seen
        assert seen["release"] == "4.4.0", seen
    else:
        assert seen["release"] == host, seen


async def test_no_kernel_setting_or_kernel_file_opens_for_writing(runtime, sbx, outsider, kernel_env):
    sid = await open_session(sbx, outsider, KERNEL)
    found = await probe(sbx, outsider, sid, "writable", KERNEL_FILES)
    assert found["tried"] > 40, found  # /proc was walked, not skipped
    assert found["opened"] == [], found["opened"][:20]
    # /proc/sys is an empty read-only folder: the settings are not there to write (nor to read).
    listed = await probe(sbx, outsider, sid, "read", "/proc/sys/kernel/core_pattern")
    assert listed["ok"] is False and listed["errno"] == errno.ENOENT, listed
    made = await probe(sbx, outsider, sid, "fill", "/proc/sys/planted", n=1)
    assert made["ok"] is False and made["errno"] in (errno.EROFS, errno.EACCES), made
    # The one reported: kernel.printk_ratelimit_burst, and core_pattern (a pipe to a program run as
    # host root at the next crash anywhere).
    knobs = ("/proc/sys/kernel/printk_ratelimit_burst", "/proc/sys/kernel/core_pattern", "/proc/sys/vm/drop_caches",
             "/proc/sys/kernel/randomize_va_space", "/proc/sys/fs/protected_symlinks")
    named = await probe(sbx, outsider, sid, "writable", ",".join(knobs))
    assert named["opened"] == [], named


async def test_a_callers_page_touches_on_a_shared_file_do_not_reach_the_authors_worker(
        runtime, sbx, sandbox_app, owner, outsider, kernel_env):
    # acme calls globex's public environment (acme's worker); globex runs it too (its own worker).
    caller = await open_session(sbx, owner, KERNEL)
    author = await open_session(sbx, outsider, KERNEL)
    assert len({id(w) for w in workers_of(sandbox_app, KERNEL)}) == 2
    evicted = await probe(sbx, outsider, author, "residency", "evict")
    assert evicted["ok"] is True and evicted["value"]["pages"] >= 6, evicted
    # The caller touches pages 2-4 of the shared file (its "tool input"); the author reads which
    # pages are resident. Before the fix: exactly [2, 3, 4] came back.
    assert (await probe(sbx, owner, caller, "residency", "touch", n=2, m=5))["ok"] is True
    seen = await probe(sbx, outsider, author, "residency", "mincore")
    assert seen["ok"] is True, seen
    if runtime == "gvisor":
        # gVisor answers residency from its own memory, which knows nothing of the host's page
        # cache: every page of a mapped file reads as resident, whoever touched what.
        # Pages 0, 1 and 5, which nobody touched, read as resident as 2-4 do.
        assert seen["value"]["result"] == 0 and set(range(6)) <= set(seen["value"]["resident"]), seen
        return
    assert seen["value"]["result"] == -1 and seen["value"]["errno"] == errno.ENOSYS, seen
    assert seen["value"]["resident"] == [], seen
    counted = await probe(sbx, outsider, author, "residency", "cachestat")
    assert counted["ok"] is True and counted["value"]["errno"] == errno.ENOSYS, counted
    # A read that must not block (RWF_NOWAIT) says "not cached" with EAGAIN: refused as unsupported.
    asked = await probe(sbx, outsider, author, "residency", "nowait", n=0, m=6)
    assert asked["ok"] is True, asked
    assert set(asked["value"]["pages"].values()) == {-errno.EOPNOTSUPP}, asked


async def test_a_package_of_private_files_too_large_to_copy_is_still_read_by_the_unprivileged_worker(
        runtime, sbx, outsider, tmp_path):
    """Bound (not copied: over COPY_MAX_FILES) and published from a 0700 folder holding 0600 files:
    readable by the sandbox's user, which owns none of them."""
    from orsplatform.catalog.services import environment_publish
    from orsplatform.sandbox.bwrap import COPY_MAX_FILES

    source = tmp_path / "private"
    write_kernel_env(source)
    (source / "manifest.toml").write_text((source / "manifest.toml").read_text().replace('"kernel"', '"bigkernel"'))
    (source / "filler").mkdir()
    for n in range(COPY_MAX_FILES + 10):
        (source / "filler" / f"{n}.txt").write_text(str(n))
    for path in [source, *source.rglob("*")]:
        path.chmod(0o700 if path.is_dir() else 0o600)
    await in_db(lambda: environment_publish(team=outsider.team, source_dir=source))
    sid = await open_session(sbx, outsider, "globex/bigkernel")
    seen = await probe(sbx, outsider, sid, "read", "/ors/env/filler/7.txt", env="globex/bigkernel")
    assert seen == {"ok": True, "value": "7"}, seen
    mounts = await probe(sbx, outsider, sid, "read", "/proc/self/mountinfo", env="globex/bigkernel")
    assert "/ors/env" in [line.split()[4] for line in mounts["value"].splitlines()]  # bound, not copied
    await assert_mount_tables_name_no_host_folder(sbx, outsider, sid, env="globex/bigkernel")
