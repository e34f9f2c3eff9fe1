"""A deployment refuses to start without ALLOWED_HOSTS or on the public development key: importing the
settings stops uvicorn and manage.py alike, with a message that says what to set."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest

from orsplatform.deployment import DEVELOPMENT_SECRET_KEY, deployment_problems
from tests.fixtures.server import ROOT, free_port

REAL_KEY = "a-long-random-production-key-8f3b2c9d1e7a4f60b5c2d9e8a7f6b5c4"


def environ(**env: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items()
            if k not in ("SECRET_KEY", "ALLOWED_HOSTS", "ORS_AGENT_KEY_SECRET", "ORS_DEPLOYMENT", "ORS_SECURE_COOKIES")}
    return {**base, "DJANGO_SETTINGS_MODULE": "orsplatform.settings", **env}


def refused(cmd: list[str], **env: str) -> str:
    """Runs cmd, which must exit (not serve) with a failure; returns what it printed."""
    done = subprocess.run(cmd, cwd=ROOT, env=environ(**env), capture_output=True, text=True, timeout=120)
    assert done.returncode != 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def uvicorn() -> list[str]:
    return [sys.executable, "-m", "uvicorn", "orsplatform.asgi:application", "--host", "127.0.0.1",
            "--port", str(free_port()), "--log-level", "warning"]


def daphne() -> list[str]:
    return [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(free_port()), "orsplatform.asgi:application"]


def manage(*args: str) -> list[str]:
    return [sys.executable, "manage.py", *args]


@pytest.mark.parametrize("server", [uvicorn, daphne])
def test_a_server_with_a_secret_key_and_no_allowed_hosts_refuses_to_start(server):
    output = refused(server(), SECRET_KEY=REAL_KEY)
    assert "Refusing to start: SECRET_KEY is set but ALLOWED_HOSTS is not" in output


def test_manage_py_refuses_the_same_way():
    assert "ALLOWED_HOSTS is not" in refused(manage("check"), SECRET_KEY=REAL_KEY)


def test_a_server_with_a_secret_key_and_allowed_hosts_starts_and_answers_only_those_hosts(server_factory):
    site = server_factory(server="uvicorn", SECRET_KEY=REAL_KEY, ALLOWED_HOSTS="127.0.0.1")
    assert httpx.get(f"{site.url}/environments/", timeout=30).status_code == 200
    forged = httpx.get(f"{site.url}/environments/", headers={"Host": "evil.example"}, timeout=30)
    assert forged.status_code == 400 and "evil.example" not in forged.text


def test_a_deployment_on_the_development_secret_key_is_refused():
    output = refused(uvicorn(), SECRET_KEY=DEVELOPMENT_SECRET_KEY, ALLOWED_HOSTS="127.0.0.1")
    assert "SECRET_KEY is the public development key" in output


@pytest.mark.parametrize("switch", [{"ORS_DEPLOYMENT": "production"}, {"ORS_SECURE_COOKIES": "1"}])
def test_a_deployment_without_a_secret_key_is_refused_rather_than_signing_with_the_development_one(switch):
    output = refused(manage("check"), ALLOWED_HOSTS="ors.example.com", **switch)
    assert "SECRET_KEY is not set" in output and "ORS_AGENT_KEY_SECRET" in output


def test_the_agent_key_secret_may_not_be_the_development_key_either():
    output = refused(manage("check"), SECRET_KEY=REAL_KEY, ALLOWED_HOSTS="127.0.0.1",
                     ORS_AGENT_KEY_SECRET=DEVELOPMENT_SECRET_KEY)
    assert "ORS_AGENT_KEY_SECRET is the public development key" in output


def test_a_deployment_answering_any_host_or_with_an_empty_agent_key_secret_is_refused():
    output = refused(manage("check"), SECRET_KEY=REAL_KEY, ALLOWED_HOSTS="*")
    assert "ALLOWED_HOSTS is '*'" in output
    output = refused(manage("check"), SECRET_KEY=REAL_KEY, ALLOWED_HOSTS="127.0.0.1", ORS_AGENT_KEY_SECRET="")
    assert "ORS_AGENT_KEY_SECRET is set but empty" in output


def test_the_embedded_default_and_a_complete_deployment_start():
    assert deployment_problems({}) == []
    assert deployment_problems({"SECRET_KEY": REAL_KEY, "ALLOWED_HOSTS": "ors.example.com"}) == []
    assert deployment_problems({"SECRET_KEY": REAL_KEY, "ALLOWED_HOSTS": "ors.example.com",
                                "ORS_AGENT_KEY_SECRET": "another-long-random-key"}) == []
    assert deployment_problems({"SECRET_KEY": REAL_KEY, "ALLOWED_HOSTS": " , "}) != []
    done = subprocess.run(manage("check"), cwd=ROOT, env=environ(SECRET_KEY=REAL_KEY, ALLOWED_HOSTS="127.0.0.1"),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
