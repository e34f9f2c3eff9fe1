"""A built image asked what it serves, before its version is published: one container started as
sessions' containers are (same runtime, limits and shim), asked for its server's schemas and
tools, and a sample task reset and closed through it, so a version whose server does not start or
cannot reset fails its build with the server's own words instead of failing its first session.

Django-free: it speaks the worker protocol directly, with the supervisor's frame limits.
"""

from __future__ import annotations

import json
import secrets
import struct
import subprocess
import threading
from collections import deque
from typing import Any

from orsplatform.containers.engine import Engine
from orsplatform.containers.images import ImageRecord
from orsplatform.containers.limits import ContainerLimits
from orsplatform.containers.worker import run_argv

HEADER = struct.Struct(">I")
MAX_REPLY = 8 * 1024 * 1024


class InspectionFailed(Exception):
    pass


class _Channel:
    def __init__(self, proc: subprocess.Popen, stderr: deque[str]) -> None:
        self.proc = proc
        self.stderr = stderr
        self.ids = 0
        self.started = False

    def _read(self) -> dict:
        assert self.proc.stdout is not None
        head = self.proc.stdout.read(HEADER.size)
        if len(head) < HEADER.size:
            raise InspectionFailed(self.ended())
        (size,) = HEADER.unpack(head)
        if size > MAX_REPLY:
            raise InspectionFailed("The container's answer was larger than the platform accepts.")
        body = self.proc.stdout.read(size)
        try:
            message = json.loads(body)
        except ValueError:
            raise InspectionFailed("The container broke the platform's protocol.") from None
        if not isinstance(message, dict):
            raise InspectionFailed("The container broke the platform's protocol.")
        return message

    def ready(self) -> None:
        if self._read().get("id") != 0:
            raise InspectionFailed("The container broke the platform's protocol.")
        self.started = True

    def ask(self, op: str, **fields: Any) -> Any:
        self.ids += 1
        body = json.dumps({"id": self.ids, "op": op, **fields}).encode()
        assert self.proc.stdin is not None
        self.proc.stdin.write(HEADER.pack(len(body)) + body)
        self.proc.stdin.flush()
        reply = self._read()
        if reply.get("id") != self.ids:
            raise InspectionFailed("The container broke the platform's protocol.")
        if not reply.get("ok"):
            raise InspectionFailed(f"{op}: {str(reply.get('error') or reply.get('kind'))[:4000]}")
        return reply.get("value")

    def ended(self) -> str:
        status = self.proc.poll()
        lines = " | ".join(list(self.stderr)[-12:])[-3000:]
        if status is None:
            what = "The container stopped answering"
        elif self.started:
            what = f"The container stopped (status {status})"
        else:
            what = f"The image's server did not start (status {status})"
        return what + (f": {lines}" if lines else ".")


def inspect_image(*, engine: Engine, record: ImageRecord, limits: ContainerLimits, sample: dict | None,
                  timeout: float) -> dict:
    """{"kind", "schema", "metadata", "tools"} of the image's server, a sample task reset."""
    name = f"ors-inspect-{secrets.token_hex(6)}"
    proc = subprocess.Popen(run_argv(engine, record, limits.limits, name, limits.cpus), env=engine.env(),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    stderr: deque[str] = deque(maxlen=40)
    drain = threading.Thread(target=_drain, args=(proc, stderr), daemon=True)
    drain.start()
    timer = threading.Timer(timeout, lambda: engine.run("rm", "-f", name, check=False, timeout=60))
    timer.start()
    channel = _Channel(proc, stderr)
    try:
        channel.ready()
        facts = channel.ask("inspect")
        channel.ask("setup", sid="inspect", entrypoint="", task_spec=sample or {}, secrets={}, first=True)
        channel.ask("stop", sid="inspect")
    except InspectionFailed as exc:
        if not timer.is_alive():
            raise InspectionFailed(f"The image's inspection took longer than {timeout:g} s.") from None
        raise InspectionFailed(str(exc)) from None
    finally:
        timer.cancel()
        try:
            proc.stdin.close()  # type: ignore[union-attr]
            proc.wait(20)
        except (OSError, subprocess.TimeoutExpired):
            engine.run("rm", "-f", name, check=False, timeout=60)
            proc.kill()
            proc.wait()
    if not isinstance(facts, dict) or not isinstance(facts.get("tools"), list) or not facts["tools"]:
        raise InspectionFailed("The image's server lists no tools.")
    return facts


def _drain(proc: subprocess.Popen, lines: deque[str]) -> None:
    assert proc.stderr is not None
    for raw in proc.stderr:
        lines.append(raw.decode("utf-8", "replace").rstrip()[:500])
