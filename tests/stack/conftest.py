"""The stack under test: docker/compose.yml brought up by bin/stack-test (`make stack-test`), which
sets ORS_STACK_URL (the proxy, the only published port), ORS_STACK_COMPOSE (the compose command with
its project and files) and ORS_STACK_DOCKER. Teams and keys are made with the image's own management
commands, as docker/README.md tells an operator to."""

from __future__ import annotations

import io
import json
import os
import shlex
import subprocess
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import httpx
import pytest

T = TypeVar("T")


def wait_until(condition: Callable[[], T], timeout: float, what: str, interval: float = 0.2) -> T:
    """Poll ``condition`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = condition()
        except (httpx.HTTPError, subprocess.CalledProcessError):
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)  # polling interval, not a wait for an outcome


@dataclass
class Person:
    token: str

    @property
    def headers(self) -> dict[str, str]:
        return {"X-API-Key": self.token}


class Stack:
    def __init__(self) -> None:
        self.url = os.environ["ORS_STACK_URL"]
        self.docker = os.environ.get("ORS_STACK_DOCKER", "docker")
        self.compose_argv = shlex.split(os.environ["ORS_STACK_COMPOSE"])

    def run(self, *argv: str, timeout: float = 120) -> str:
        return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=timeout).stdout

    def compose(self, *args: str, timeout: float = 120) -> str:
        return self.run(*self.compose_argv, *args, timeout=timeout)

    def container(self, service: str, index: int = 0) -> str:
        """The id of a service's container (the first, or the index-th of its replicas)."""
        ids = sorted(self.compose("ps", "-q", service).split())
        return ids[index]

    def manage(self, *args: str) -> str:
        return self.compose("exec", "-T", "web", "python", "manage.py", *args)

    def shell(self, code: str) -> str:
        """Python run by Django's shell in a gateway container (reads what only the database holds)."""
        return self.compose("exec", "-T", "web", "python", "manage.py", "shell", "-c", code)

    def runners_live(self) -> str:
        return httpx.get(f"{self.url}/ready", timeout=5).json().get("runners", "")

    def wait_ready(self, runners: int = 2, timeout: float = 120) -> None:
        wait_until(lambda: self.runners_live() == f"{runners} live", timeout, f"/ready with {runners} live runners")


@pytest.fixture(scope="session")
def stack() -> Stack:
    if not os.environ.get("ORS_STACK_URL"):
        pytest.skip("needs the stack: run by `make stack-test` (bin/stack-test)")
    return Stack()


@pytest.fixture(scope="session")
def record():
    """Figures the tests measure (e.g. kill_to_410_seconds), written to ORS_STACK_FIGURES as JSON."""
    figures: dict[str, float] = {}
    yield figures
    path = os.environ.get("ORS_STACK_FIGURES")
    if path:
        with open(path, "w") as f:
            json.dump(figures, f, indent=1)


def _team(stack: Stack, slug: str) -> Person:
    stack.manage("create_team", slug, "--name", slug.title())
    out = stack.manage("create_api_key", slug, "stack-test", "--scopes", "sessions,publish")
    return Person(token=out.strip().splitlines()[-1].strip())


@pytest.fixture(scope="session")
def owner(stack) -> Person:
    return _team(stack, "acme")


@pytest.fixture(scope="session")
def outsider(stack) -> Person:
    return _team(stack, "rival")


def zip_bytes(files: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return buf.getvalue()
