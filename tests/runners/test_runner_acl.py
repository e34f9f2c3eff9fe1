"""A runner node under its own Redis ACL user (keys.runner_acl_rules): it serves episodes, and that
user cannot MONITOR, list keys, or read session records and results."""

from __future__ import annotations

import secrets

import httpx
import pytest
import redis
from redis.exceptions import NoPermissionError, ResponseError

from orsplatform.runners.keys import runner_acl_rules
from tests.fixtures.ors import sse_result

pytestmark = pytest.mark.e2e


@pytest.fixture
def runner_user(cluster):
    """An ACL user for this test's runners (server-wide: prefixed sbx-test-, deleted afterwards)."""
    name, password = f"sbx-test-runner-{secrets.token_hex(4)}", secrets.token_hex(16)
    admin = cluster.redis
    admin.execute_command("ACL", "SETUSER", name, *runner_acl_rules(cluster.prefix, password))
    yield name, password
    admin.execute_command("ACL", "DELUSER", name)


def test_a_runner_serves_episodes_under_its_own_acl_user_which_cannot_read_sessions(
        cluster, server_factory, owner, runner_user, live_db):
    name, password = runner_user
    admin_url = cluster.redis_url
    runner_url = admin_url.replace("redis://", f"redis://{name}:{password}@", 1)
    cluster.redis_url = runner_url
    try:
        cluster.start_runner()
    finally:
        cluster.redis_url = admin_url
    gateway = server_factory(**cluster.env())
    headers = owner.headers
    sid = httpx.post(f"{gateway.url}/create_session", headers=headers).json()["sid"]
    r = httpx.post(f"{gateway.url}/math/create", headers={**headers, "X-Session-ID": sid},
                   json={"split": "train", "index": 0}, timeout=30)
    assert r.status_code == 200, r.text
    r = httpx.post(f"{gateway.url}/math/call", headers={**headers, "X-Session-ID": sid},
                   json={"name": "submit", "input": {"answer": "0"}}, timeout=60)
    assert "output" in sse_result(r.text), r.text

    runner = redis.Redis.from_url(runner_url)
    for command in (("KEYS", "*"), ("SCAN", "0"), ("MONITOR",), ("FLUSHALL",), ("CONFIG", "GET", "*"),
                    ("GET", f"{cluster.prefix}:state:{sid}"), ("GET", f"{cluster.prefix}:result:x"),
                    ("GET", "some-other-key")):
        with pytest.raises((NoPermissionError, ResponseError)):
            runner.execute_command(*command)
