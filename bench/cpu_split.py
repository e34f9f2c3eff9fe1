"""Where the machine's CPU went during a load window, by process name: what a benchmark's ratio is
made of (the gateway's Python, the docker CLI and engine relaying a container's stdio, gVisor's
sentry and its ptrace stubs, the author's server, the load generator).

    with cpu_split.window(delay=warmup, duration=duration) as split:
        run the load
    print(cpu_split.report(split.result))

Reads /proc/<pid>/stat (utime + stime of every thread of a live process) at the window's start and
end; a process that ends inside the window is not counted (none of the long-lived ones does).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

TICK = os.sysconf("SC_CLK_TCK")


def snapshot() -> dict[int, tuple[str, float]]:
    """pid -> (name, CPU seconds used so far)."""
    out: dict[int, tuple[str, float]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            raw = open(f"/proc/{entry}/stat", "rb").read().decode(errors="replace")
            name = raw[raw.index("(") + 1:raw.rindex(")")]
            fields = raw[raw.rindex(")") + 2:].split()
            out[int(entry)] = (_label(int(entry), name), (int(fields[11]) + int(fields[12])) / TICK)
    return out


def _label(pid: int, name: str) -> str:
    """A python process is told apart by what it runs (the gateway, the load, the author's server)."""
    if not name.startswith(("python", "uvicorn")):
        return name
    with contextlib.suppress(OSError):
        argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        text = " ".join(a.decode(errors="replace") for a in argv)
        for marker, label in (("orsplatform.asgi", "python: gateway"), ("--load-only", "python: load (reference)"),
                              ("containers_bench", "python: bench + load"), ("shim.py", "python: shim"),
                              ("uvicorn", "python: author's server"), ("celery", "python: celery")):
            if marker in text:
                return label
    return name


@dataclass
class Window:
    result: Counter = field(default_factory=Counter)
    seconds: float = 0.0


@contextlib.contextmanager
def window(*, delay: float, duration: float) -> Iterator[Window]:
    """CPU seconds by process name over [delay, delay + duration) from now, measured on a thread
    while the caller runs its load."""
    found = Window()

    def measure() -> None:
        time.sleep(delay)  # the load's warm-up: not measured, as the load's own figures are not
        t0, before = time.monotonic(), snapshot()
        time.sleep(duration)
        after = snapshot()
        found.seconds = time.monotonic() - t0
        for pid, (name, used) in after.items():
            found.result[name] += used - before.get(pid, (name, 0.0))[1] if pid in before else 0.0

    thread = threading.Thread(target=measure, daemon=True)
    thread.start()
    try:
        yield found
    finally:
        thread.join()


def report(found: Window, episodes: float, top: int = 12) -> str:
    """The largest consumers: CPU seconds per second of the window, and CPU ms per episode."""
    lines = []
    total = sum(v for v in found.result.values() if v > 0)
    for name, used in found.result.most_common(top):
        if used <= 0:
            break
        lines.append(f"    {name:<28} {used / found.seconds:5.2f} CPU  {1000 * used / max(episodes, 1):6.2f} ms/episode")
    lines.append(f"    {'total':<28} {total / found.seconds:5.2f} CPU  {1000 * total / max(episodes, 1):6.2f} ms/episode")
    return "\n".join(lines)
