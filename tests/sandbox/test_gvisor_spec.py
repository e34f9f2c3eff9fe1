"""gVisor's OCI spec is drawn from bubblewrap's plan (sandbox/gvisor.py): the same mounts, sizes, modes,
links, environment and folder, and the syscall filter's unconditional refusals (seccomp.oci)."""

from __future__ import annotations

import errno

from orsplatform.sandbox import gvisor, seccomp

PLAN = ["--unshare-ipc", "--die-with-parent", "--hostname", "sandbox", "--clearenv",
        "--setenv", "HOME", "/tmp", "--size", "1048576", "--perms", "1777", "--tmpfs", "/tmp",
        "--ro-bind", "/usr", "/usr", "--symlink", "usr/lib", "/lib", "--proc", "/proc",
        "--size", "4096", "--perms", "0555", "--tmpfs", "/proc/sys", "--remount-ro", "/proc/sys",
        "--dev", "/dev", "--size", "2048", "--perms", "1777", "--tmpfs", "/dev/shm", "--remount-ro", "/dev",
        "--dir", "/ors/env", "--bind", "/var/x", "/ors/work", "--chdir", "/ors/env", "--remount-ro", "/"]


def test_the_spec_holds_bubblewraps_mounts_links_environment_and_folder():
    spec = gvisor.oci_spec(PLAN, ["/usr/bin/python3", "-I"], uid=1879048200, rlimits=[("RLIMIT_NOFILE", 64)])
    mounts = {m["destination"]: m for m in spec["mounts"]}
    assert mounts["/tmp"]["options"] == ["nosuid", "nodev", "mode=1777", "size=1048576"]
    assert mounts["/dev/shm"]["options"] == ["nosuid", "nodev", "mode=1777", "size=2048"]
    assert mounts["/usr"] == {"destination": "/usr", "type": "bind", "source": "/usr", "options": ["rbind", "ro"]}
    assert mounts["/ors/work"]["options"] == ["rbind", "rw"]
    assert "/proc/sys" not in mounts and mounts["/proc"]["type"] == "proc"  # gVisor's own /proc/sys
    assert spec["links"] == [["usr/lib", "/lib"], ["", "/ors/env"]]
    assert spec["process"]["env"] == ["HOME=/tmp"] and spec["process"]["cwd"] == "/ors/env"
    assert spec["process"]["user"] == {"uid": 1879048200, "gid": 1879048200}
    assert spec["process"]["noNewPrivileges"] is True and spec["process"]["capabilities"]["bounding"] == []
    assert spec["process"]["rlimits"] == [{"type": "RLIMIT_NOFILE", "hard": 64, "soft": 64}]
    assert spec["root"] == {"path": "rootfs", "readonly": True}
    assert {"type": "network"} in spec["linux"]["namespaces"]  # loopback only


def test_network_when_allowed_shares_the_hosts_namespace():
    spec = gvisor.oci_spec(PLAN, ["true"], uid=1, network=True)
    assert {"type": "network"} not in spec["linux"]["namespaces"]


def test_the_filter_inside_gvisor_is_the_unconditional_eperm_rules():
    rules = seccomp.oci()
    assert rules["defaultAction"] == "SCMP_ACT_ALLOW"
    [denied] = rules["syscalls"]
    assert denied["errnoRet"] == errno.EPERM and denied["action"] == "SCMP_ACT_ERRNO"
    for name in ("ptrace", "process_vm_readv", "unshare", "mount", "bpf", "keyctl", "io_uring_setup"):
        assert name in denied["names"]
    # Argument rules would refuse every call of the name under this gVisor (all threads, for clone).
    for name in ("clone", "clone3", "fcntl", "preadv2", "mincore"):
        assert name not in denied["names"]
