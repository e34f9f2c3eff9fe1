"""Hostile code for the validation and prompt-render children (tests/catalog/test_inspection_host_files.py,
tests/hub/test_prompt_render_host_files.py), and the checks that go with it: what the platform's own
environment holds, how much lands on the host's disk while a child runs, a deadline on a request
that might block forever."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

# Planting things where a child's results once were: the work folder (mounted at /ors/work in the
# sandbox, or the parent of HOME without it), the child's HOME, TMPDIR and working directory.
PLANT = r'''
import os as _os


def _places():
    seen = []
    for d in (_os.getcwd(), _os.environ.get("HOME", ""), _os.environ.get("TMPDIR", ""), "/ors/work", "/tmp"):
        for p in (d, _os.path.dirname(d.rstrip("/"))):
            if p and p != "/" and p not in seen:
                seen.append(p)
    return seen


RESULT_NAMES = ("stderr.log", "stdout.log", "report.json", "report.json.tmp", "out.json", "spec.json",
                "sample.json", "tasks/0.jsonl", "tasks/1.jsonl")


def plant(make, names=RESULT_NAMES):
    """make(path) at every result name in every place it can; the paths it managed."""
    done = []
    for place in _places():
        for name in names:
            path = _os.path.join(place, name)
            try:
                _os.makedirs(_os.path.dirname(path), exist_ok=True)
                if _os.path.lexists(path):
                    _os.remove(path)
                make(path)
                done.append(path)
            except OSError:
                pass
    return done


def after_last_report(action):
    """action(pipe) once the inspector has sent its last report on its result pipe: tenant code
    shares the inspector's process, so it can reach the pipe as the inspector does."""
    import gc

    for channel in [o for o in gc.get_objects() if type(o).__name__ == "Channel" and hasattr(o, "out")]:
        def report(r, real=channel.report, out=channel.out):
            real(r)
            if r.get("check") == "done" or "error" in r:
                action(out)
                out.flush()

        channel.report = report


def fill(total):
    """Writes `total` bytes to a file in every place it can; the bytes each place took."""
    chunk = b"x" * (4 << 20)
    written = {}
    for place in _places():
        done = 0
        try:
            with open(_os.path.join(place, "fill.bin"), "wb") as fh:
                while done < total:
                    fh.write(chunk)
                    done += len(chunk)
        except OSError:
            pass
        written[place] = done
    return written
'''


def platform_environment() -> list[str]:
    """``NAME=value`` entries of this process's own environment (what /proc/self/environ of the
    platform shows) that a sandboxed child is never given: none may reach a tenant."""
    given = {"PATH", "HOME", "LANG", "TMPDIR", "PWD", "SHLVL", "_", "TERM", "MALLOC_ARENA_MAX", "LC_ALL"}
    entries = Path("/proc/self/environ").read_bytes().decode("utf-8", "replace").split("\0")
    return [e for e in entries if "=" in e and e.split("=", 1)[0] not in given and len(e.split("=", 1)[1]) >= 6]


def leaked(text: str, entries: list[str]) -> list[str]:
    return [e.split("=", 1)[0] for e in entries if e in text]


class DiskWatch:
    """The most bytes seen at once in files under `root` while it is entered (sampled every 20 ms
    in a thread): what a child's run put on the host's disk there."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _size(self) -> int:
        total = 0
        for dirpath, _, files in os.walk(self.root):
            for name in files:
                with contextlib.suppress(OSError):
                    total += os.lstat(os.path.join(dirpath, name)).st_size
        return total

    def _run(self) -> None:
        while True:
            self.peak = max(self.peak, self._size())
            if self._stop.wait(0.02):  # a sampling period, not a synchronisation
                return

    def __enter__(self) -> DiskWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._size())


class Blocked(Exception):
    pass


@contextlib.contextmanager
def answers_within(seconds: float) -> Iterator[None]:
    """Raises Blocked in the main thread if the block has not finished within `seconds` (a call
    blocked in open() of a FIFO included): a test of "answers, not forever" fails instead of hanging."""
    def expired(signum, frame):
        raise Blocked(f"no answer within {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
