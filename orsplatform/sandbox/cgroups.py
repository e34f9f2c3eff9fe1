"""One cgroup per sandbox worker: limits the kernel enforces on the worker as a whole.

rlimits bind one process each (three forked children of 500 MiB each hold 1.5 GiB under a 1 GiB
RLIMIT_AS) and RLIMIT_NPROC does not bind uid 0; a cgroup counts the worker and everything it
forks, tmpfs pages it writes (/tmp, /dev/shm) included:

- memory: cgroup v2 ``memory.max`` (and ``memory.swap.max`` 0, ``memory.oom.group`` 1: an
  out-of-memory kill takes the whole worker); v1 ``memory.limit_in_bytes`` (and
  ``memory.memsw.limit_in_bytes`` where swap accounting is on). The supervisor polls the
  cgroup's oom-kill count and ends a worker that hit its limit (v1 has no oom.group), so its
  sessions end with that reason;
- pids: ``pids.max`` (v1 and v2);
- cpu: ``cpu.weight`` (v2) / ``cpu.shares`` (v1), the same for every worker, so a tenant that
  starts many busy processes still gets one worker's share of the CPU; all workers together (their
  parent) weigh less than one platform process, so the supervisor serving every team runs first
  (``weigh_all``);
- busy workers weigh less: the supervisor reads each worker's CPU time (v2 ``cpu.stat``
  ``usage_usec``; v1 ``cpuacct.usage``, in the cpuacct hierarchy where it is mounted apart from
  cpu, else its processes' times) and demotes one that keeps a CPU busy (pool.py), restoring it
  once calm: ``cpu.idle`` 1 where the kernel has it (v1 and v2, Linux 5.15+: the group is
  scheduled like SCHED_IDLE) and a low weight: a tenant burning CPU then yields at once to a calm
  worker that wakes on its CPU, whose wake-up otherwise waited for the burner's slice
  (bench/tenant_noise.py's `burn`);
- killing from outside: the supervisor kills what is in the cgroup (v2 ``cgroup.kill`` where the
  kernel has it), never trusting code inside the sandbox to do it.

Cgroups are made under the supervisor's own cgroup (so the host's or container's limits on the
platform still cover its workers): on v1 in each controller's hierarchy, on v2 in the unified
one, where the supervisor's cgroup must be delegated to it (a root process, or systemd's
``Delegate=yes``; a supervisor sitting in that cgroup is moved into a ``supervisor`` leaf first,
the usual delegation protocol). Where none can be made (not root, nothing delegated), workers
run with rlimits alone, said once in the log.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import uuid
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("orsplatform.sandbox")
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

V1_CONTROLLERS = ("memory", "pids", "cpu")
# What a gVisor sandbox needs of its cgroup for itself (measured: an idle Python worker under the
# ptrace platform holds 40-60 host tasks and about 60 MiB outside the tenant's own memory).
GVISOR_TASKS = 256
GVISOR_MEMORY_BYTES = 256 * 1024 * 1024
# Where a v1 kernel mounts cpuacct apart from cpu (this machine), workers get a cgroup there too, so
# their CPU time (children included) is one read; co-mounted ("cpu,cpuacct"), the cpu one has it.
V1_OPTIONAL = ("cpuacct",)
GROUP = "ors-sandbox"
# The sandbox's pid 1 (bubblewrap's init) and the process it starts (the worker, the inspector):
# the numbers they always get in the sandbox's own pid namespace.
SANDBOX_INIT_PID, SANDBOX_MAIN_PID = 1, 2


@dataclass(frozen=True)
class _Layout:
    version: int  # 1 or 2
    parents: dict[str, Path]  # controller (v2: "unified") -> where worker cgroups are made


def _mounts() -> tuple[dict[str, Path], Path | None]:
    """cgroup v1 controller -> mount point, and the cgroup2 mount point."""
    v1: dict[str, Path] = {}
    v2: Path | None = None
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, tail = left.split(), right.split()
            if len(fields) < 5 or len(tail) < 3:
                continue
            fstype, options = tail[0], tail[2].split(",")
            if fstype == "cgroup2" and v2 is None:
                v2 = Path(fields[4])
            elif fstype == "cgroup":
                for option in options:
                    if option in V1_CONTROLLERS or option in V1_OPTIONAL:
                        v1.setdefault(option, Path(fields[4]))
    return v1, v2


def _own_paths() -> dict[str, str]:
    """This process's cgroup per v1 controller, and "" -> its v2 cgroup."""
    own: dict[str, str] = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                own[controller] = path
    return own


def _make_parent(mount: Path, own: str) -> Path | None:
    """`ors-sandbox` under this process's cgroup, else under the hierarchy's root."""
    for base in (mount / own.lstrip("/"), mount):
        parent = base / GROUP
        try:
            parent.mkdir(exist_ok=True)
            return parent
        except OSError:
            continue
    return None


def _v2_parent(mount: Path, own: str) -> Path | None:
    base = mount / own.lstrip("/")
    wanted = {"memory", "pids", "cpu"}
    try:
        available = set((base / "cgroup.controllers").read_text().split())
    except OSError:
        return None
    if not wanted <= available:
        return None
    enable = " ".join(f"+{c}" for c in sorted(wanted))
    try:
        (base / "cgroup.subtree_control").write_text(enable)
    except OSError as exc:
        if exc.errno != 16:  # EBUSY: processes sit in it ("no internal processes")
            return None
        # Move this supervisor (all its threads) into a leaf, then enable the controllers.
        leaf = base / "supervisor"
        try:
            leaf.mkdir(exist_ok=True)
            for pid in (base / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):
                    (leaf / "cgroup.procs").write_text(pid)
            (base / "cgroup.subtree_control").write_text(enable)
        except OSError:
            return None
        log.info("sandbox cgroups: moved the supervisor into %s to delegate %s to its workers", leaf, base)
    parent = base / GROUP
    try:
        parent.mkdir(exist_ok=True)
        (parent / "cgroup.subtree_control").write_text(enable)
    except OSError:
        return None
    return parent


@functools.cache
def layout() -> _Layout | None:
    """Where this process makes worker cgroups (None: nowhere; said once in the log)."""
    why = "not running as root"
    if os.geteuid() == 0:
        try:
            v1, v2 = _mounts()
            own = _own_paths()
        except OSError as exc:
            v1, v2, own, why = {}, None, {}, str(exc)
        if v1.keys() >= set(V1_CONTROLLERS):
            parents = {c: _make_parent(v1[c], own.get(c, "/")) for c in V1_CONTROLLERS}
            if all(parents.values()):
                for c in V1_OPTIONAL:  # best effort: without it, CPU time is read per process
                    if c in v1 and v1[c] != v1["cpu"] and (parent := _make_parent(v1[c], own.get(c, "/"))):
                        parents[c] = parent
                _remove_orphans(parents.values())  # type: ignore[arg-type]
                return _Layout(1, parents)  # type: ignore[arg-type]
            why = "the cgroup v1 hierarchies are not writable"
        elif v2 is not None:
            parent = _v2_parent(v2, own.get("", "/"))
            if parent is not None:
                _remove_orphans([parent])
                return _Layout(2, {"unified": parent})
            why = "this process's cgroup v2 is not delegated to it with the memory, pids and cpu controllers"
        else:
            why = "no cgroup hierarchy with the memory, pids and cpu controllers is mounted"
    log.warning("sandbox workers get no cgroup (%s): their limits are per-process rlimits only (memory per "
                "process, no CPU share, forks bounded by RLIMIT_NPROC, which does not bind uid 0)", why)
    return None


def weigh_all(total_cpu_weight: int) -> None:
    """Give the workers' parent cgroup its CPU weight (v2 scale; v1 shares = weight * 1024 / 100).

    The parent competes as one entity with the supervisor (the gateway or runner node, weight 100
    like any process) and the host's other processes. Below one process's weight (default 25) the
    supervisor runs first when tenants' workers keep every CPU busy: its event loop serves every
    team's calls, so a burn that delayed it would slow every team (bench/tenant_noise.py measured
    the quiet team's p50 x1.6-1.8 at one process's weight per CPU, x1.0-1.2 at 25). Weights bind only
    under contention: workers still get every CPU the platform leaves idle. Written at every
    worker's start (one small write), not once: the parent is shared by every supervisor on the
    host, and the last one started must not leave it at another weight for good."""
    lay = layout()
    if lay is None:
        return
    weight = max(1, min(10000, total_cpu_weight))
    with contextlib.suppress(OSError):
        if lay.version == 2:
            (lay.parents["unified"] / "cpu.weight").write_text(str(weight))
        else:
            (lay.parents["cpu"] / "cpu.shares").write_text(str(max(2, weight * 1024 // 100)))


def _remove_orphans(parents) -> None:
    """Remove the empty cgroups of supervisors that are gone (killed before they could): each is
    named after the supervisor's pid, so another live supervisor's are never touched."""
    for parent in parents:
        with contextlib.suppress(OSError):
            for child in parent.iterdir():
                owner = child.name.partition("-")[0]
                if not child.is_dir() or not owner.isdigit() or _alive(int(owner)):
                    continue
                with contextlib.suppress(OSError):
                    child.rmdir()  # fails while processes remain in it: left alone


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class WorkerCgroup:
    """The cgroup (v1: one per controller) of one sandbox worker."""

    def __init__(self, lay: _Layout, paths: dict[str, Path]) -> None:
        self.version = lay.version
        self.paths = paths

    @classmethod
    def create(cls, *, memory_bytes: int, processes: int, cpu_weight: int,
               total_cpu_weight: int = 25, runtime: str = "bwrap") -> WorkerCgroup | None:
        lay = layout()
        if lay is None:
            return None
        if runtime == "gvisor":
            # Beside the tenant's, gVisor's own tasks and memory: the Sentry's threads, the gofer,
            # a ptrace stub per tenant thread; the tenant's own count and sizes are held inside by
            # gVisor (the spec's RLIMIT_NPROC and RLIMIT_AS), this is the outer wall around both.
            memory_bytes += GVISOR_MEMORY_BYTES
            processes = 2 * processes + GVISOR_TASKS
        weigh_all(total_cpu_weight)
        name = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"  # the supervisor's pid: see _remove_orphans
        paths = {c: parent / name for c, parent in lay.parents.items()}
        group = cls(lay, paths)
        try:
            for path in paths.values():
                path.mkdir()
            if lay.version == 2:
                group._write("unified", "memory.max", memory_bytes)
                group._write("unified", "memory.swap.max", 0, optional=True)
                group._write("unified", "memory.oom.group", 1, optional=True)
                group._write("unified", "pids.max", processes)
                group._write("unified", "cpu.weight", max(1, min(10000, cpu_weight)))
            else:
                group._write("memory", "memory.limit_in_bytes", memory_bytes)
                group._write("memory", "memory.memsw.limit_in_bytes", memory_bytes, optional=True)
                group._write("pids", "pids.max", processes)
                group._write("cpu", "cpu.shares", max(2, cpu_weight * 1024 // 100))
        except OSError as exc:
            log.warning("could not set up a cgroup for a sandbox worker: %s", exc)
            group.remove()
            return None
        return group

    def _write(self, controller: str, name: str, value: int, optional: bool = False) -> None:
        path = self.paths[controller] / name
        if optional and not path.exists():
            return
        path.write_text(str(value))

    @property
    def procs_files(self) -> list[str]:
        """The cgroup.procs files a process writes its pid into to join this cgroup."""
        return [str(p / "cgroup.procs") for p in self.paths.values()]

    def _main(self) -> Path:
        return self.paths["unified" if self.version == 2 else "pids"]

    def pids(self) -> list[int]:
        # A remove() that got part way has dropped the main hierarchy's path: its rmdir succeeded,
        # so no process is left in any of them.
        try:
            return [int(p) for p in (self._main() / "cgroup.procs").read_text().split()]
        except (OSError, ValueError, KeyError):
            return []

    def read(self, controller: str, name: str) -> str:
        return (self.paths["unified" if self.version == 2 else controller] / name).read_text()

    def cpu_seconds(self) -> float | None:
        """CPU time the worker has used so far (every process it ever had), None if unknown."""
        try:
            if self.version == 2:
                for line in self.read("unified", "cpu.stat").splitlines():
                    key, _, value = line.partition(" ")
                    if key == "usage_usec":
                        return int(value) / 1e6
                return None
            # cpuacct apart (its own cgroup) or co-mounted with cpu (the cpu cgroup has the file)
            where = self.paths.get("cpuacct") or self.paths["cpu"]
            return int((where / "cpuacct.usage").read_text()) / 1e9
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError):
            return None
        # v1 without cpuacct: the live processes' own and reaped children's times.
        ticks = 0
        for pid in self.pids():
            with contextlib.suppress(OSError, ValueError, IndexError):
                with open(f"/proc/{pid}/stat", "rb") as f:
                    fields = f.read().rpartition(b")")[2].split()
                ticks += sum(int(x) for x in fields[11:15])
        return ticks / _CLOCK_TICKS

    def set_cpu_weight(self, weight: int) -> None:
        """The worker's CPU weight (v2 scale) from now on (ignored once the cgroup is gone; refused
        by the kernel while cpu.idle is 1, which gives the group the smallest weight itself)."""
        weight = max(1, min(10000, weight))
        with contextlib.suppress(OSError, KeyError):
            if self.version == 2:
                self._write("unified", "cpu.weight", weight)
            else:
                self._write("cpu", "cpu.shares", max(2, weight * 1024 // 100))

    def set_cpu_idle(self, idle: bool) -> bool:
        """``cpu.idle``: scheduled like SCHED_IDLE against its sibling cgroups (any of them waking
        preempts it; a CPU running only idle groups counts as free when a woken task is placed).
        Leaving idle resets the weight to the default's: set it again after. False where the kernel
        has no cpu.idle (before 5.15)."""
        try:
            self._write("unified" if self.version == 2 else "cpu", "cpu.idle", int(idle), optional=True)
            return (self.paths["unified" if self.version == 2 else "cpu"] / "cpu.idle").exists()
        except (OSError, KeyError):
            return False

    def oom_kills(self) -> int:
        """How many processes of the worker the kernel killed for the memory limit."""
        try:
            text = self.read("memory", "memory.events" if self.version == 2 else "memory.oom_control")
        except (OSError, KeyError):  # KeyError: removed
            return 0
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def kill(self) -> None:
        """SIGKILL every process in the cgroup (from outside the sandbox)."""
        if self.version == 2:
            with contextlib.suppress(OSError, KeyError):
                (self.paths["unified"] / "cgroup.kill").write_text("1")
                return
        for pid in self.pids():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

    def kill_strays(self) -> int:
        """SIGKILL every process of the sandbox but its init and the process it started: what
        sessions left behind (setsid children, daemons). Tenant code cannot opt out (it may replace
        the worker's own clean-up). Returns how many were killed."""
        return kill_strays(self.pids())

    def remove(self) -> bool:
        """Remove the (empty) cgroup; False while processes are still leaving it."""
        done = True
        for controller, path in list(self.paths.items()):
            try:
                path.rmdir()
            except FileNotFoundError:
                pass
            except OSError:
                done = False
                continue
            del self.paths[controller]
        return done


def _nspid(pid: int) -> list[int]:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("NSpid:"):
                return [int(x) for x in line.split()[1:]]
    return []


def kill_strays(pids: list[int]) -> int:
    """Of `pids`, SIGKILL those inside a sandbox's pid namespace other than its init and main
    process (those outside it, such as the launcher's own bubblewrap, are kept)."""
    killed = 0
    for pid in pids:
        try:
            nspid = _nspid(pid)
        except (OSError, ValueError):
            continue
        if len(nspid) > 1 and nspid[-1] not in (SANDBOX_INIT_PID, SANDBOX_MAIN_PID):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
    return killed


def descendants(root: int) -> list[int]:
    """Every process below `root` (for a supervisor without cgroups): a sandbox's orphans are
    re-parented to its init, itself below bubblewrap, so none escapes this walk."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
            ppid = int(stat[stat.rindex(b")") + 2:].split()[1])
        except (OSError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found
