"""DNS rebinding: the address the platform connects to is the one it judged. The resolver is the one
input driven here (a name that answers a public address when checked and a private one after);
the listeners, the agent server and the platform's HTTP stack are real."""

from __future__ import annotations

import socketserver
import threading

import httpx
import pytest

from orsplatform.evals import egress
from tests.evals.conftest import api, launch, wait_run

META = b'{"version": 1, "agents": []}'


class Recorder(socketserver.ThreadingTCPServer):
    """A real HTTP listener that answers a /meta and records which of its addresses each
    connection reached and the Host it named."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.seen: list[tuple[str, str]] = []
        super().__init__((host, 0), Handler)
        self.port = self.server_address[1]
        threading.Thread(target=self.serve_forever, daemon=True).start()


class Handler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        lines = []
        while (line := self.rfile.readline(65536)) not in (b"\r\n", b""):
            lines.append(line.decode("latin-1").strip())
        host = next((v.strip() for k, _, v in (x.partition(":") for x in lines) if k.lower() == "host"), "")
        self.server.seen.append((self.connection.getsockname()[0], host))
        self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(META), META))


@pytest.fixture
def recorder():
    server = Recorder()
    yield server
    server.shutdown()
    server.server_close()


class Rebinding:
    """A name whose answers change with each lookup: `answers[i]` for the i-th, the last one after."""

    def __init__(self, name: str, answers: list[str]) -> None:
        self.name, self.answers, self.calls = name, answers, 0
        self.lock = threading.Lock()

    def __call__(self, host: str, port: int) -> list[str]:
        if host != self.name:
            return egress.system_resolve(host, port)
        with self.lock:
            answer = self.answers[min(self.calls, len(self.answers) - 1)]
            self.calls += 1
        return [answer]


def test_a_name_rebound_to_loopback_after_its_check_is_never_connected_to(owner, settings, monkeypatch, recorder):
    # Checked: a public address. Connected: whatever the name says then, judged again, so never loopback.
    settings.ORS_EVAL_AGENT_ALLOWED_HOSTS = []
    rebind = Rebinding("rebind.test", ["93.184.215.14", "127.0.0.1"])
    monkeypatch.setattr(egress, "resolve", rebind)
    r = api(owner).post("/api/v1/agents", {"name": "r", "agent": "solver", "url": f"http://rebind.test:{recorder.port}"},
                        format="json")
    assert r.status_code == 400, r.content
    assert r.json()["detail"] == (f"The agent's host rebind.test:{recorder.port} (127.0.0.1) has a non-public address; "
                                  "the operator may allow it with ORS_EVAL_AGENT_ALLOWED_HOSTS.")
    assert rebind.calls == 2  # the registration's check, then the connection's own
    assert recorder.seen == []


def test_a_connection_resolves_once_and_goes_to_the_address_it_judged(settings, monkeypatch, recorder):
    # The name would answer 127.0.0.2 (not allowed) to any second lookup: there is none.
    settings.ORS_EVAL_AGENT_ALLOWED_HOSTS = [f"127.0.0.1:{recorder.port}"]
    rebind = Rebinding("agent.test", ["127.0.0.1", "127.0.0.2"])
    monkeypatch.setattr(egress, "resolve", rebind)
    with httpx.Client(transport=egress.transport(), trust_env=False) as client:
        r = client.get(f"http://agent.test:{recorder.port}/meta")
    assert r.status_code == 200 and r.content == META
    assert rebind.calls == 1
    # The socket went to the judged address; the request still names the host it asked for.
    assert recorder.seen == [("127.0.0.1", f"agent.test:{recorder.port}")]
    with httpx.Client(transport=egress.transport(), trust_env=False) as client, \
            pytest.raises(egress.EgressRefused, match=r"\(127\.0\.0\.2\) is not in ORS_EVAL_AGENT_ALLOWED_HOSTS"):
        client.get(f"http://agent.test:{recorder.port}/meta")
    assert len(recorder.seen) == 1


def test_a_run_whose_agent_is_rebound_mid_run_fails_its_episodes_without_reaching_it(
        owner, agents, settings, monkeypatch):
    port = agents.url.rsplit(":", 1)[1]
    # Registration (its check and its connection) and the run's start see loopback, which the
    # allow-list admits on the agent's port; every connection after that sees 10.9.8.7.
    rebind = Rebinding("agent.test", ["127.0.0.1", "127.0.0.1", "127.0.0.1", "10.9.8.7"])
    monkeypatch.setattr(egress, "resolve", rebind)
    body = {"name": "rebound", "url": f"http://agent.test:{port}", "api_key": "agent-secret-key-5f2b",
            "agent": "solver", "stream": "delta"}
    r = api(owner).post("/api/v1/agents", body, format="json")
    assert r.status_code == 201, r.content
    agents.reset()
    run = wait_run(owner, launch(owner, r.json()["id"], stop=2, concurrency=1)["id"])
    assert run["status"] == "finished" and run["done"] == 2 and run["passed"] == 0, run
    for episode in run["episodes"]:
        assert episode["error"] == (f"The agent's address agent.test:{port} (10.9.8.7) is not in "
                                    "ORS_EVAL_AGENT_ALLOWED_HOSTS."), episode
    assert rebind.calls >= 5  # every episode's connection looked the name up again, and was refused
    assert agents.stats()["puts"] == 0  # no turn reached the agent's server
