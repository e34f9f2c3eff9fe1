"""Each runner node under a Redis ACL user of its own (executors/acl.py, keys.runner_acl_rules): the
nodes serve episodes, and one node's user can touch neither another node's queue nor its channels,
cannot read session records or results, and cannot MONITOR or list keys."""

from __future__ import annotations

import json
import secrets

import httpx
import pytest
import redis
from redis.exceptions import NoPermissionError, ResponseError

from orsplatform.executors import acl
from tests.fixtures.ors import sse_result

pytestmark = pytest.mark.e2e
REFUSED = (NoPermissionError, ResponseError)


@pytest.fixture
def node_users(cluster, monkeypatch):
    """Two node names with their ACL users, made by the acl command (deleted afterwards)."""
    hostnames = [f"sbx-test-node-{secrets.token_hex(3)}@{cluster.prefix}" for _ in range(2)]
    passwords = {h: secrets.token_hex(16) for h in hostnames}
    for hostname, password in passwords.items():
        monkeypatch.setenv(acl.password_variable(hostname), password)
    monkeypatch.setenv("REDIS_URL", cluster.redis_url)
    monkeypatch.setenv("ORS_REDIS_PREFIX", cluster.prefix)
    assert acl.main(hostnames) == 0
    urls = {h: cluster.redis_url.replace("redis://", f"redis://{acl.user_name(h)}:{passwords[h]}@", 1)
            for h in hostnames}
    yield urls
    for hostname in hostnames:
        cluster.redis.execute_command("ACL", "DELUSER", acl.user_name(hostname))


def _episode(gateway_url: str, headers: dict) -> str:
    sid = httpx.post(f"{gateway_url}/create_session", headers=headers).json()["sid"]
    r = httpx.post(f"{gateway_url}/math/create", headers={**headers, "X-Session-ID": sid},
                   json={"split": "train", "index": 0}, timeout=30)
    assert r.status_code == 200, r.text
    r = httpx.post(f"{gateway_url}/math/call", headers={**headers, "X-Session-ID": sid},
                   json={"name": "submit", "input": {"answer": "0"}}, timeout=60)
    assert "output" in sse_result(r.text), r.text
    return sid


def test_each_runner_serves_episodes_under_its_own_user_which_reaches_nothing_of_the_other_node(
        cluster, server_factory, owner, node_users, live_db):
    first, second = node_users
    for hostname, url in node_users.items():
        assert cluster.start_runner(hostname.partition("@")[0], redis_url=url) == hostname
    gateway = server_factory(**cluster.env())
    sids = [_episode(gateway.url, owner.headers) for _ in range(4)]
    # Placement is least-loaded: both nodes serve the (still open) sessions.
    records = [json.loads(cluster.redis.get(f"{cluster.prefix}:state:{sid}")) for sid in sids]
    assert {r["state"] for r in records} == {"ready"}
    assert {r["runner"].partition("#")[0] for r in records} == {first, second}

    node = redis.Redis.from_url(node_users[first])
    # What is its own, it reaches (a refused command raises, so each line can fail): its inbox's
    # length, and its heartbeat, read back as the gateways see it (same boot and pid).
    assert isinstance(node.llen(f"{cluster.prefix}:inbox:{first}"), int)
    own = node.get(f"{cluster.prefix}:runner:{first}")
    assert own is not None, "the node's user cannot read its own heartbeat"
    seen = cluster.heartbeat(first)
    assert {k: json.loads(own).get(k) for k in ("boot", "pid")} == {k: seen.get(k) for k in ("boot", "pid")}
    forbidden = [
        ("KEYS", "*"), ("SCAN", "0"), ("MONITOR",), ("FLUSHALL",), ("CONFIG", "GET", "*"), ("CLIENT", "LIST"),
        ("GET", f"{cluster.prefix}:state:{sids[0]}"), ("GET", f"{cluster.prefix}:result:x"),
        ("GET", "some-other-key"),
        # the other node's inbox: neither read, nor taken from, nor fed
        ("LRANGE", f"{cluster.prefix}:inbox:{second}", "0", "-1"), ("RPOP", f"{cluster.prefix}:inbox:{second}"),
        ("LPUSH", f"{cluster.prefix}:inbox:{second}", "x"), ("BRPOP", f"{cluster.prefix}:inbox:{second}", "1"),
        ("BLMPOP", "1", "1", f"{cluster.prefix}:inbox:{second}", "RIGHT"),
        # its own inbox is only taken from: a node cannot feed itself work nor scripts run anything
        ("LPUSH", f"{cluster.prefix}:inbox:{first}", "x"), ("EVAL", "return 1", "0"),
        # the other node's heartbeat and the other node's channels to the gateways
        ("SET", f"{cluster.prefix}:runner:{second}", "{}"),
        ("PUBLISH", f"{cluster.prefix}:sessions:{second}", "{}"),
        ("PUBLISH", f"{cluster.prefix}:gw:somegateway:{second}", "{}"),
    ]
    for command in forbidden:
        with pytest.raises(REFUSED):
            node.execute_command(*command)
    for channel in (f"{cluster.prefix}:sessions:{second}", f"{cluster.prefix}:gw:somegateway:{second}"):
        listener = node.pubsub()
        with pytest.raises(REFUSED):
            listener.subscribe(channel)
            listener.get_message(timeout=1)
        listener.close()
    listener = node.pubsub()
    with pytest.raises(REFUSED):  # no patterns: a node cannot listen to every gateway
        listener.psubscribe(f"{cluster.prefix}:*")
        listener.get_message(timeout=1)
    listener.close()
