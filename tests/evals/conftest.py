"""The reference AAP agent server (tests/evals/aap_agent.py) in its own process, and helpers to
register agents and wait for runs through the REST API."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from kombu.transport import memory
from rest_framework.test import APIClient

from tests.fixtures.server import ROOT, free_port

AGENT_KEY = "agent-secret-key-5f2b"
TERMINAL = ("finished", "cancelled", "failed")


@dataclass
class AgentServer:
    url: str
    process: subprocess.Popen
    log: Path

    def stats(self) -> dict:
        return httpx.get(f"{self.url}/_stats", timeout=5).json()

    def reset(self) -> None:
        httpx.post(f"{self.url}/_reset", timeout=5).raise_for_status()


def start_agent_server(tmp: Path, api_key: str = AGENT_KEY, script: str = "aap_agent.py",
                       args: tuple[str, ...] = ()) -> AgentServer:
    port = free_port()
    log = tmp / f"aap-agent-{port}.log"
    process = subprocess.Popen([sys.executable, str(ROOT / "tests" / "evals" / script), "--port", str(port),
                                "--api-key", api_key, *args], cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT)
    server = AgentServer(url=f"http://127.0.0.1:{port}", process=process, log=log)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert process.poll() is None, log.read_text()
        try:
            if httpx.get(f"{server.url}/meta", timeout=1).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.1)  # polling interval while waiting on the readiness condition
    process.kill()
    raise RuntimeError(f"agent server did not start:\n{log.read_text()}")


def stop_process(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


@pytest.fixture(scope="session")
def agent_server(tmp_path_factory):
    server = start_agent_server(tmp_path_factory.mktemp("aap"))
    yield server
    stop_process(server.process)


@pytest.fixture(scope="session")
def sdk_agent_servers(tmp_path_factory):
    """Agent servers shaped as the AAP TypeScript SDK's (tests/evals/aap_sdk_agent.py), by AAP version."""
    tmp = tmp_path_factory.mktemp("aap-sdk")
    servers = {version: start_agent_server(tmp, script="aap_sdk_agent.py", args=("--version", str(version)))
               for version in (2, 3)}
    yield servers
    for server in servers.values():
        stop_process(server.process)


@pytest.fixture
def sdk_agents(sdk_agent_servers, settings):
    settings.ORS_EVAL_AGENT_ALLOWED_HOSTS = [s.url.removeprefix("http://") for s in sdk_agent_servers.values()]
    for server in sdk_agent_servers.values():
        server.reset()
    return sdk_agent_servers


class PromptMemoryTransport(memory.Transport):
    """Celery's in-memory broker, with the waits of its worker's loop cut short. As shipped, the
    loop looks for a message once a second and waits 2 s on the broker between its checks for a
    stop, twice on the way out: every test of this folder spent 4 s stopping its worker and up to
    1 s before a run's task was picked up. The loop and what it does are Celery's own."""

    polling_interval = 0.02  # how long an empty look waits before the next (seconds)

    def drain_events(self, connection, timeout=None):
        # The worker's loop asks for 2 s; None (block until a message) is left as it is.
        return super().drain_events(connection, timeout=None if timeout is None else min(timeout, 0.05))


@pytest.fixture(autouse=True)
def platform_worker(live_db):
    """A Celery worker in this process (Celery's own test worker, on its in-memory broker) instead
    of the suite's eager configuration: its task waits for the run it drives, as a real worker's
    does, while the test goes on (cancels it, watches it). A run must not outlive its test: a
    cancelled run's worker notices within a second, and its episodes would otherwise land in the
    next test."""
    from celery.contrib.testing.worker import start_worker

    from orsplatform.celery import app
    from orsplatform.evals import engine as engine_module

    saved = {name: app.conf[name] for name in ("task_always_eager", "broker_url", "broker_transport")}
    app.conf.update(task_always_eager=False, broker_url="memory://",
                    broker_transport=f"{__name__}:{PromptMemoryTransport.__name__}")
    fresh_connections(app)
    app.loader.import_default_modules()
    try:
        with start_worker(app, pool="threads", concurrency=4, perform_ping_check=False, shutdown_timeout=60,
                          loglevel="WARNING"):
            yield
            if engine_module._engine is not None:
                deadline = time.monotonic() + 60
                while not all(f.done() for f in list(engine_module._engine.runs.values())):
                    assert time.monotonic() < deadline, "an evaluation run was still being driven after its test"
                    time.sleep(0.05)  # polling interval while waiting on the condition
    finally:
        app.conf.update(saved)
        fresh_connections(app)


def fresh_connections(app) -> None:
    """The app keeps the connection and producer pools of the broker it first sent to (an earlier
    test's, in a whole-suite run): a broker changed later is used only by pools made after it, so
    without this the runs' tasks went to the suite's Redis while the test worker read memory://."""
    app._pool = None
    app.amqp._producer_pool = None


@pytest.fixture
def agents(agent_server, settings):
    # Tests reach the agent on loopback; production refuses non-public hosts unless allowed.
    settings.ORS_EVAL_AGENT_ALLOWED_HOSTS = [agent_server.url.removeprefix("http://")]  # 127.0.0.1:PORT
    agent_server.reset()
    return agent_server


def api(person) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_X_API_KEY=person.token)
    return client


def register(person, server: AgentServer, agent: str = "solver", stream: str = "none", **extra) -> dict:
    body = {"name": f"{agent}-{stream}", "url": server.url, "api_key": AGENT_KEY, "agent": agent, "stream": stream,
            **extra}
    r = api(person).post("/api/v1/agents", body, format="json")
    assert r.status_code == 201, r.content
    return r.json()


def launch(person, agent_id: int, environment: str = "builtin/math", split: str = "test", start: int = 0,
           stop: int = 6, **extra) -> dict:
    body = {"agent": agent_id, "environment": environment, "split": split, "start": start, "stop": stop,
            "concurrency": 4, "max_turns": 5, **extra}
    r = api(person).post("/api/v1/eval-runs", body, format="json")
    assert r.status_code == 201, r.content
    return r.json()


def run_state(person, run_id: int) -> dict:
    r = api(person).get(f"/api/v1/eval-runs/{run_id}")
    assert r.status_code == 200, r.content
    return r.json()


def wait_run(person, run_id: int, *, until=lambda run: run["status"] in TERMINAL, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        run = run_state(person, run_id)
        if until(run):
            return run
        brief = {k: v for k, v in run.items() if k != "episodes"}
        assert time.monotonic() < deadline, f"run {run_id} did not get there: {brief}"
        time.sleep(0.05)  # polling interval while waiting on the condition
