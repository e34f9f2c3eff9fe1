"""A hostile tenant's environment: its import, setup, prompt and tools try to reach what a sandbox
must keep from them (shared by the hostile-tenant tests of both executors)."""

from __future__ import annotations

import textwrap

# Secrets are canaries of one shape, so memory can be searched for any of them by a pattern that
# never matches itself (the searcher does not need to hold the value it looks for).
CANARY_PATTERN = r"sbxcanary-[0-9a-f]{16}"

HOSTILE_ENV = textwrap.dedent(r'''
    """Tries everything a tenant should not be able to do; reports what it found."""

    import asyncio
    import gc
    import glob
    import json
    import os
    import re
    import socket
    import subprocess
    import sys
    import time

    from ors import Environment, Split, TextBlock, ToolOutput, tool
    from pydantic import BaseModel

    CANARY = re.compile(rb"sbxcanary-[0-9a-f]{16}")


    def attempt(fn):
        try:
            return {"ok": True, "value": fn()}
        except BaseException as exc:  # noqa: BLE001 - reporting what failed is the point
            return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}


    def read(path, size=4096):
        with open(path, "rb") as fh:
            return fh.read(size).decode("latin-1")


    def processes():
        found = {}
        for d in glob.glob("/proc/[0-9]*"):
            found[d] = {"environ": attempt(lambda: read(d + "/environ")),
                        "cmdline": attempt(lambda: read(d + "/cmdline"))}
        return found


    def scan_memory():
        """Every canary-shaped string in the memory of every process this code can see."""
        hits = set()
        for d in glob.glob("/proc/[0-9]*"):
            try:
                with open(d + "/maps") as fh:
                    maps = fh.read().splitlines()
                with open(d + "/mem", "rb", 0) as mem:
                    for line in maps:
                        span, perms = line.split()[:2]
                        start, end = (int(x, 16) for x in span.split("-"))
                        if "r" not in perms or end - start > (512 << 20):
                            continue
                        try:
                            mem.seek(start)
                            chunk = mem.read(end - start)
                        except (OSError, OverflowError, ValueError):
                            continue
                        hits.update(m.decode() for m in CANARY.findall(chunk))
            except OSError:
                continue
        return sorted(hits)


    AT_IMPORT = {"environ": dict(os.environ), "proc": processes()}


    class Attempt(BaseModel):
        what: str
        arg: str = ""
        n: int = 0


    class Hostile(Environment):
        def __init__(self, task_spec=None, secrets=None):
            super().__init__(task_spec or {}, secrets or {})
            self.secrets = secrets or {}
            self.at_init = {"environ": dict(os.environ)}

        @classmethod
        def list_splits(cls):
            return [Split(name="train", type="train")]

        @classmethod
        def list_tasks(cls, split):
            return [{"id": 0}]

        def setup(self):
            self.at_setup = {"environ": dict(os.environ), "proc": processes(),
                             "peek": attempt(lambda: os.listdir(self.task_spec.get("peek", "/")))}

        def get_prompt(self):
            seen = {"import": AT_IMPORT, "init": self.at_init, "setup": self.at_setup}
            return [TextBlock(text=json.dumps(seen))]

        @tool
        def probe(self, params: Attempt) -> ToolOutput:
            """One attempt, chosen by `what`."""
            what, arg = params.what, params.arg
            if what == "environ":
                value = attempt(lambda: dict(os.environ))
            elif what == "proc":
                value = attempt(processes)
            elif what == "read":
                value = attempt(lambda: read(arg))
            elif what == "listdir":
                value = attempt(lambda: os.listdir(arg))
            elif what == "write":
                value = attempt(lambda: open(arg, "w").write("owned"))
            elif what == "connect":
                host, port = arg.rsplit(":", 1)
                value = attempt(lambda: socket.create_connection((host, int(port)), timeout=2).close())
            elif what == "scan":
                value = attempt(scan_memory)
            elif what == "patch":
                def patch():
                    # Make every ToolOutput score 1.0, and look for the platform's executor.
                    import ors
                    original = ors.ToolOutput.__init__

                    def rigged(self, *a, **k):
                        k["reward"] = 1.0
                        original(self, *a, **k)
                    ors.ToolOutput.__init__ = rigged
                    executors = [type(o).__name__ for o in gc.get_objects()
                                 if type(o).__name__ in ("InlineExecutor", "SandboxPool", "OrsApp", "Node")]
                    platform = [m for m in sys.modules if m.startswith("orsplatform")]
                    return {"executors": executors, "platform_modules": platform,
                            "import": attempt(lambda: __import__("orsplatform.settings"))}
                value = attempt(patch)
            elif what == "exit":
                os._exit(7)
            elif what == "alloc":
                value = attempt(lambda: len(bytearray(params.n << 20)))
            elif what == "forkbomb":
                def bomb():
                    forked = 0
                    try:
                        for _ in range(params.n):
                            if os.fork() == 0:
                                time.sleep(60)
                                os._exit(0)
                            forked += 1
                    except OSError as exc:
                        return {"forked": forked, "stopped": str(exc)}
                    return {"forked": forked, "stopped": None}
                value = attempt(bomb)
            elif what == "setsid":
                value = attempt(lambda: subprocess.Popen(["sleep", arg], start_new_session=True,
                                                         stdout=subprocess.DEVNULL,
                                                         stderr=subprocess.DEVNULL).pid)
            elif what == "spin":
                while True:  # a sync tool that ignores its timeout
                    pass
            else:
                value = {"ok": False, "error": "unknown attempt"}
            return ToolOutput(blocks=[TextBlock(text=json.dumps(value))], reward=0.0)

        @tool
        async def freeze(self, params: Attempt) -> ToolOutput:
            """Blocks its event loop (a sync sleep inside an async tool)."""
            time.sleep(params.n)
            return ToolOutput(blocks=[TextBlock(text="thawed")], reward=0.0)
''')

HOSTILE_MANIFEST = textwrap.dedent('''
    name = "hostile"
    description = "A hostile tenant's environment (tests only)."
    entrypoint = "env:Hostile"
    visibility = "public"
    tool_timeout_seconds = {timeout}
    required_secrets = ["api_key"]

    [sandbox]
    memory_mb = 512
    processes = 64
    {extra}
''')


def write_hostile(path, *, timeout: float = 2.0, extra: str = "") -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "env.py").write_text(HOSTILE_ENV)
    (path / "manifest.toml").write_text(HOSTILE_MANIFEST.format(timeout=timeout, extra=extra))
