"""One sandbox worker as its supervisor sees it: the process (started as bwrap.py's `command` says,
under bubblewrap or gVisor), its framed pipe (`_Frames`), its requests and their deadlines, its
cgroup, CPU pacing and how it ended. pool.py keeps these per (environment version, team, caller).

A worker that dies takes only its own sessions: their waiters get `WorkerGone` with a reason
naming the environment.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import os
import signal
import struct
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson

from orsplatform.sandbox import gvisor
from orsplatform.sandbox.bwrap import command
from orsplatform.sandbox.cgroups import WorkerCgroup, descendants, kill_strays
from orsplatform.sandbox.config import Limits, SandboxConfig
from orsplatform.sandbox.framing import PARSE_OFF_LOOP_BYTES, REPLY_ID, ChannelLimits, ReplyTooLarge

log = logging.getLogger("orsplatform.sandbox")
HEADER = struct.Struct(">I")
# The pipes' StreamReader limit: it stops reading a worker's pipe once twice this much waits unread,
# so a worker writing faster than the supervisor reads is held back by its pipe, not buffered here
# (frame sizes are framing.py's; a stderr line longer than this ends the draining of tenant prints).
MAX_FRAME = 4 * 1024 * 1024
JANITOR_SECONDS = 0.5
DEADLINE_TICK = 0.05  # how often a worker with requests in flight checks their deadlines (s)
# A busy worker (ORS_SANDBOX_BUSY_CPU) gets its weight back once it has used less than that share
# of a CPU for this long (a burn with short pauses between its calls stays demoted).
CALM_SECONDS = 1.0
# A pair whose worker was killed for a protocol fault waits this long before its next worker
# starts, doubling with each fault within BACKOFF_RESET_SECONDS of the last, up to the maximum.
BACKOFF_FIRST_SECONDS, BACKOFF_MAX_SECONDS, BACKOFF_RESET_SECONDS = 0.5, 30.0, 120.0
LAZY_SECONDS = 0.05
READ_CHUNK = 256 * 1024


class _Stop(Exception):
    """Ends the reader loop."""


class WorkerGone(Exception):
    """The worker holding the session ended; str(exc) says why, naming the environment."""


class WorkerError(Exception):
    """The worker answered a request with an error (`kind`: setup, unknown, error)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class CallTimedOut(Exception):
    """No answer within the request's timeout; the worker is killed if none comes within the grace."""


class Worker:
    def __init__(self, key: tuple, label: str, config: SandboxConfig) -> None:
        self.key = key
        self.label = label
        self.config = config
        self.proc: asyncio.subprocess.Process | None = None
        self.sessions: set[str] = set()
        self.idle_since: float | None = time.monotonic()
        self.dead: str | None = None  # why it ended, once it has
        self.kill_reason: str | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self._overdue: dict[int, float] = {}  # request id -> when the worker is killed for it
        self._deadlines: dict[int, float] = {}  # request id -> when it times out (monotonic)
        self._deadline_tick: asyncio.TimerHandle | None = None
        self._ready: asyncio.Future | None = None
        self._reader: asyncio.Task | None = None
        self._stderr: collections.deque[str] = collections.deque(maxlen=20)
        self._cgroup: WorkerCgroup | None = None
        self._limits: Limits | None = None
        # CPU pacing (pace()): the last reading of the worker's CPU time, (when, seconds used), and
        # since when it has been calm while demoted.
        self.busy = False
        self._cpu_seen: tuple[float, float] | None = None
        self._calm_since: float | None = None
        # Frames not yet written: every frame of one event-loop pass goes out in one write (one
        # wake-up of the worker instead of one per frame); lazy ones (teardowns) wait for the
        # next urgent frame or LAZY_SECONDS.
        self._out: list[bytes] = []
        self._flush_soon: asyncio.Handle | None = None
        self._flush_later: asyncio.TimerHandle | None = None
        # Told (sessions, reason) when the worker ends with sessions in it (runner nodes record it).
        self.on_death: Callable[[list[str], str], None] | None = None
        self.on_fault: Callable[[], None] | None = None
        self.environ: dict[str, str] = {}  # the secrets it starts with (start_secrets), set by the pool

    @property
    def alive(self) -> bool:
        return self.dead is None

    @classmethod
    def start_secrets(cls, package_dir: str, secrets: Mapping[str, str]) -> dict[str, str]:
        """Those of a session's secrets the worker is started with (so they key the pool's worker):
        none for a Python worker, whose environments get a session's secrets at its setup."""
        return {}

    async def spawn(self, package_dir: str, limits: Limits) -> None:
        self._limits = limits
        if self.config.isolated:
            self._cgroup = WorkerCgroup.create(memory_bytes=limits.memory_bytes, processes=limits.processes,
                                               cpu_weight=self.config.cpu_weight,
                                               total_cpu_weight=self.config.total_cpu_weight,
                                               runtime=self.config.mode)
        # A fixed PATH: the host's (a virtualenv's bin, a checkout) would show in the sandbox
        # init's /proc/1/environ.
        path = "/usr/local/bin:/usr/bin:/bin" if self.config.isolated else os.environ.get("PATH", "/usr/bin:/bin")
        try:
            argv = command(self.config, package_dir, limits, cgroup=self._cgroup)
            self.proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, limit=MAX_FRAME, env={"PATH": path},
                start_new_session=True, close_fds=True)
        except BaseException:
            if self._cgroup is not None:  # nothing started in it: gone with the failed start
                self._cgroup.remove()
                self._cgroup = None
            raise
        loop = asyncio.get_running_loop()
        self._ready = loop.create_future()
        self._reader = asyncio.create_task(self._read())
        asyncio.create_task(self._drain_stderr())
        try:
            async with asyncio.timeout(self.config.start_seconds):
                await asyncio.shield(self._ready)
        except (TimeoutError, WorkerGone) as exc:
            self.kill("it did not start in time" if isinstance(exc, TimeoutError) else None)
            detail = "; ".join(self._stderr)[-2000:]
            raise WorkerGone(f"The sandbox for environment {self.label} could not start"
                             f"{': ' + detail if detail else ''}.") from None

    async def _drain_stderr(self) -> None:
        # Tenant code's prints land here. Kept (the last lines, for a worker that fails to start)
        # but never logged: environment code may print its session's secrets.
        assert self.proc is not None and self.proc.stderr is not None
        with contextlib.suppress(Exception):
            while line := await self.proc.stderr.readline():
                text = line.decode(errors="replace").rstrip()[:500]
                self._stderr.append(text)

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        stdout = self.proc.stdout
        # The channel is bounded (framing.py): whatever tenant code writes on it, the supervisor
        # holds at most one answer of ORS_MAX_TOOL_OUTPUT_BYTES, for at most the frame deadline.
        frames = _Frames(self, ChannelLimits.current())
        try:
            # Whatever the pipe holds, then every whole frame in it: a batch of replies costs one
            # read, not two awaits per frame.
            while chunk := await stdout.read(READ_CHUNK):
                await frames.feed(chunk)
        except (_Stop, ConnectionError):
            pass
        except Exception as exc:  # garbage on the pipe: the worker (tenant code) broke the protocol
            self.kill(f"it broke the supervisor protocol ({type(exc).__name__})", fault=True)
        finally:
            frames.close()
        try:
            returncode = await asyncio.wait_for(self.proc.wait(), 2.0)
        except TimeoutError:  # it closed its end of the pipe but lives on: nothing can reach it
            self.kill("it closed its channel to the platform")
            returncode = await self.proc.wait()
        self._died(returncode)

    def _answer(self, message: Any) -> None:
        request_id = message.get("id") if isinstance(message, dict) else None
        if not isinstance(request_id, int) or isinstance(request_id, bool):
            self.kill("it sent a message that is not a reply", fault=True)
            raise _Stop
        if request_id == 0 and self._ready is not None and not self._ready.done():
            self._ready.set_result(None)
            return
        future = self._take(request_id)
        if not future.done():
            future.set_result(message)

    def _refuse(self, request_id: int, exc: Exception) -> None:
        """End a pending request with `exc` (its answer was too large to be taken)."""
        future = self._take(request_id)
        if not future.done():
            future.set_exception(exc)

    def _take(self, request_id: int) -> asyncio.Future:
        """The pending request a reply answers. Every reply answers a request the supervisor sent
        (a cancelled one's id stays pending until its late reply): anything else is a flood, or an
        attempt to answer for another, and kills the worker."""
        future = self._pending.pop(request_id, None)
        if future is None:
            self.kill("it sent a message that answers no request", fault=True)
            raise _Stop
        self._overdue.pop(request_id, None)
        self._deadlines.pop(request_id, None)
        return future

    def _expire(self) -> None:
        """Time out the requests past their deadline. Their answer may still come (the tool finishes
        late); if it does not within the grace period, the worker is killed (janitor, `overdue`), so
        a stuck thread cannot hold a node forever. The id stays pending until that late answer."""
        self._deadline_tick = None
        now = time.monotonic()
        expired = [rid for rid, at in self._deadlines.items() if at <= now]
        for rid in expired:
            del self._deadlines[rid]
            future = self._pending.get(rid)
            if future is not None and not future.done():
                self._overdue[rid] = now + self.config.grace_seconds
                future.set_exception(CallTimedOut())
        if self._deadlines and self.dead is None:
            self._deadline_tick = asyncio.get_running_loop().call_later(DEADLINE_TICK, self._expire)

    def _write(self, frame: bytes, lazy: bool) -> None:
        self._out.append(frame)
        if self._flush_soon is not None:
            return
        loop = asyncio.get_running_loop()
        if not lazy:
            self._flush_soon = loop.call_soon(self._flush)
        elif self._flush_later is None:
            self._flush_later = loop.call_later(LAZY_SECONDS, self._flush)

    def _flush(self) -> None:
        self._flush_soon = None
        if self._flush_later is not None:
            self._flush_later.cancel()
            self._flush_later = None
        if not self._out:
            return
        data, self._out = b"".join(self._out), []
        try:
            assert self.proc is not None and self.proc.stdin is not None
            self.proc.stdin.write(data)
        except (ConnectionError, RuntimeError, AssertionError):
            # The pipe is gone: the worker ended (its reader reports how, and fails every pending
            # request) or closed its end, which leaves nothing to talk to.
            self.kill()

    def _died(self, returncode: int | None) -> None:
        if not self.kill_reason and self.out_of_memory():
            self.kill_reason = self.memory_reason()
        if self.kill_reason:
            how = f"it was stopped because {self.kill_reason}"
        elif returncode is not None and returncode < 0:
            how = f"its process was killed by {signal.Signals(-returncode).name}"
        elif returncode is not None and returncode > 128 and returncode - 128 in signal.Signals._value2member_map_:
            # bubblewrap reports the worker's death by a signal as 128 + the signal's number.
            how = f"its process was killed by {signal.Signals(returncode - 128).name}"
        else:
            how = f"its process exited with status {returncode}"
        self.dead = f"The environment {self.label} stopped: {how}."
        if self.sessions and self.on_death is not None and self.kill_reason != "the platform shut down":
            try:
                self.on_death(sorted(self.sessions), self.dead)
            except Exception:
                log.exception("could not report the end of a worker of %s", self.label)
        for future in self._pending.values():
            if not future.done():
                future.set_exception(WorkerGone(self.dead))
        self._pending.clear()
        self._overdue.clear()
        self._deadlines.clear()
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(WorkerGone(self.dead))
            self._ready.exception()  # retrieved: spawn() reports it
        if self._cgroup is not None:
            self._cgroup.kill()  # nothing of the sandbox outlives it (its init's death ends the rest too)
        if self._cgroup is not None and not self._cgroup.remove():
            # Its processes are still leaving it (the sandbox dies a moment after bubblewrap).
            asyncio.get_running_loop().create_task(_remove_later(self._cgroup))
        self._cgroup = None

    def kill(self, reason: str | None = None, fault: bool = False) -> None:
        """`fault`: killed for breaking the channel's protocol (a flood, an unfinished or oversized
        frame): its pair's next worker starts only after a back-off (SandboxPool.backoff)."""
        if reason and not self.kill_reason:
            self.kill_reason = reason
        if fault and self.on_fault is not None and self.proc is not None and self.proc.returncode is None:
            on_fault, self.on_fault = self.on_fault, None
            on_fault()
        if self.proc is not None and self.proc.returncode is None:
            # The whole process group: prlimit/bwrap and, through bwrap's pid namespace, every
            # process the tenant started (setsid children included) ends with it.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
        if self._cgroup is not None:
            self._cgroup.kill()

    def end_strays(self) -> None:
        """Kill, from outside the sandbox, every process but its init and the worker: what ended
        sessions left behind. The worker does the same from inside (worker.end_strays), but tenant
        code can replace that; this it cannot."""
        if self.proc is None or self.proc.returncode is not None or not self.config.isolated:
            return
        if self.config.mode == "gvisor":
            # The cgroup holds gVisor's own processes, not the tenant's: gVisor lists and kills those.
            task = asyncio.get_running_loop().run_in_executor(None, gvisor.kill_strays, self.proc.pid)
            task.add_done_callback(_consume)
            return
        try:
            kill_strays(self._cgroup.pids() if self._cgroup is not None else descendants(self.proc.pid))
        except OSError:
            log.debug("could not look for stray processes of a worker of %s", self.label)

    def pace(self, now: float) -> None:
        """Lower the CPU weight of a worker that keeps a CPU busy, and restore it once calm.

        Every worker has the same weight, so a tenant burning a CPU holds it against a calm worker
        that wakes up on that CPU for a call: the calm one waits for the scheduler's wake-up
        preemption or the burner's slice, ~2 ms on each of another team's calls (bench/
        tenant_noise.py's `burn`, x1.5). Demoted (cgroup cpu.idle 1 with ORS_SANDBOX_BUSY_CPU_IDLE,
        and a weight of ORS_SANDBOX_BUSY_CPU_WEIGHT), the burner yields at once and runs on whatever
        the others leave (x1.2; x1.3 with the weight alone): neither binds without contention, so a
        busy worker alone (or among busy ones) keeps every CPU it had."""
        threshold = self.config.busy_cpu
        if self._cgroup is None or threshold <= 0:
            return
        used = self._cgroup.cpu_seconds()
        if used is None:
            return
        seen, self._cpu_seen = self._cpu_seen, (now, used)
        if seen is None or now - seen[0] <= 0:
            return
        share = (used - seen[1]) / (now - seen[0])
        if share >= threshold:
            self._calm_since = None
            if not self.busy:
                self.busy = True
                self._cgroup.set_cpu_weight(self.config.busy_cpu_weight)
                if self.config.busy_cpu_idle:
                    self._cgroup.set_cpu_idle(True)
                log.info("sandbox worker %s for %s is busy (%.0f%% of a CPU): weight %d until calm",
                         self.proc.pid if self.proc else "?", self.label, share * 100, self.config.busy_cpu_weight)
        elif self.busy:
            if self._calm_since is None:
                self._calm_since = seen[0]
            if now - self._calm_since >= CALM_SECONDS:
                self.busy = False
                self._calm_since = None
                if self.config.busy_cpu_idle:
                    self._cgroup.set_cpu_idle(False)  # first: the kernel refuses a weight while idle
                self._cgroup.set_cpu_weight(self.config.cpu_weight)
                log.info("sandbox worker %s for %s is calm again: weight %d",
                         self.proc.pid if self.proc else "?", self.label, self.config.cpu_weight)

    def out_of_memory(self) -> bool:
        """Did the kernel kill a process of this worker for its cgroup's memory limit?"""
        return self._cgroup is not None and self._cgroup.oom_kills() > 0

    def memory_reason(self) -> str:
        mib = (self._limits.memory_bytes >> 20) if self._limits is not None else 0
        return f"its processes together used more than its memory limit of {mib} MiB"

    async def request(self, op: str, timeout: float | None = None, lazy: bool = False, **fields: Any) -> Any:
        """Send op and await its reply. A lazy request (one nobody waits for, such as a teardown)
        may wait up to LAZY_SECONDS to share its write with the next one."""
        if self.dead is not None:
            raise WorkerGone(self.dead)
        assert self.proc is not None and self.proc.stdin is not None
        request_id = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        body = orjson.dumps({"id": request_id, "op": op, **fields})
        if self.proc.stdin.is_closing():
            self._pending.pop(request_id, None)
            raise WorkerGone(self.dead or f"The environment {self.label} stopped.")
        self._write(HEADER.pack(len(body)) + body, lazy)
        if timeout is not None:
            # A deadline checked by one ticking timer per worker (_expire), not a timeout scope and
            # a shield per request: thousands of calls a second each paid for a timer and two futures.
            self._deadlines[request_id] = time.monotonic() + timeout
            if self._deadline_tick is None:
                self._deadline_tick = asyncio.get_running_loop().call_later(DEADLINE_TICK, self._expire)
        try:
            reply = await future
        except asyncio.CancelledError:
            # The id stays pending (its future done) until the reply comes: a late reply is then
            # dropped, not taken for a message that answers no request.
            future.add_done_callback(_consume)
            raise
        if reply.get("ok"):
            return reply.get("value")
        raise WorkerError(reply.get("kind", "error"), reply.get("error", ""))

    def recent_stderr(self) -> list[str]:
        """The last lines the worker wrote to stderr (tenant prints, tracebacks)."""
        return list(self._stderr)

    def overdue(self, now: float) -> bool:
        return any(deadline <= now for deadline in self._overdue.values())


async def _remove_later(cgroup: WorkerCgroup, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not cgroup.remove() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)  # polling: the kernel gives no event for an emptied cgroup v1


def _consume(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()


_PARSER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ors-frames")


class _Frames:
    """A worker's channel as the supervisor reads it: whole frames are decoded (large ones on a
    thread) and answered; a frame over the output limit is never held whole (its beginning is
    kept for the audit log, the rest discarded as it arrives); a frame begun and not finished
    within the deadline kills the worker."""

    def __init__(self, worker: Worker, limits: ChannelLimits) -> None:
        self.worker = worker
        self.limits = limits
        self.buffer = bytearray()
        self.skipping = 0  # bytes of an over-limit frame still to discard
        self.skip_size = 0
        self.skip_id: int | None = None  # its request, once read from its beginning
        self.head = bytearray()
        self.timer: asyncio.TimerHandle | None = None

    async def feed(self, chunk: bytes) -> None:
        completed = False
        if self.skipping:
            chunk = self._discard(chunk)
            if self.skipping:
                return
            completed = True
        buffer = self.buffer
        buffer += chunk
        offset, end = 0, len(buffer)
        limits = self.limits
        while end - offset >= HEADER.size:
            (size,) = HEADER.unpack_from(buffer, offset)
            if size > limits.max_frame:
                self.worker.kill("it sent a message larger than the protocol allows", fault=True)
                raise _Stop
            start = offset + HEADER.size
            if size > limits.max_output:
                self.skipping, self.skip_size, self.skip_id, self.head = size, size, None, bytearray()
                rest = self._discard(bytes(memoryview(buffer)[start:]))
                del buffer[:]
                if self.skipping:
                    self._arm(restart=True)
                    return
                buffer += rest
                offset, end, completed = 0, len(buffer), True
                continue
            if end - start < size:
                break
            if size > PARSE_OFF_LOOP_BYTES:
                body = bytes(memoryview(buffer)[start:start + size])
                message = await asyncio.get_running_loop().run_in_executor(_PARSER, orjson.loads, body)
            else:
                message = orjson.loads(memoryview(buffer)[start:start + size])
            self.worker._answer(message)
            offset = start + size
            completed = True
        del buffer[:offset]
        if buffer:
            self._arm(restart=completed)
        else:
            self._disarm()

    def _discard(self, chunk: bytes) -> bytes:
        """Take the over-limit frame's bytes from `chunk`; what follows it is returned."""
        take = min(len(chunk), self.skipping)
        want = max(self.limits.truncated, 64)  # at least enough to read the reply's id
        if len(self.head) < want:
            self.head += chunk[:min(take, want - len(self.head))]
        self.skipping -= take
        if self.skip_id is None and (len(self.head) >= want or not self.skipping):
            match = REPLY_ID.match(self.head)
            if match is None:
                self.worker.kill("it sent a message that is not a reply", fault=True)
                raise _Stop
            self.skip_id = int(match.group(1))
            # Answered now (the caller need not wait for the rest to be discarded); an id that
            # answers no request kills the worker before the rest is read.
            head = bytes(self.head[:self.limits.truncated]).decode("utf-8", "replace")
            self.worker._refuse(self.skip_id, ReplyTooLarge(self.skip_size, self.limits.max_output, head))
            self.head = bytearray()
        return chunk[take:]

    def _arm(self, restart: bool) -> None:
        if self.timer is not None and not restart:
            return  # the same partial frame: its deadline stands
        self._disarm()
        self.timer = asyncio.get_running_loop().call_later(self.limits.deadline, self._overdue)

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _overdue(self) -> None:
        self.timer = None
        self.worker.kill(f"a message from it did not arrive whole within {self.limits.deadline:g} s", fault=True)

    def close(self) -> None:
        self._disarm()
