"""The runner node's inbox (executors/inbox.py, docs/runner-nodes.md): a Redis list per node and a
message format of our own, read by a real node process."""

from __future__ import annotations

import json

import pytest

from orsplatform.executors import inbox
from tests.fixtures.celery import wait_until


def test_a_message_reads_back_as_its_op_and_arguments():
    raw = inbox.message("call", "sid-1", "task-1", "submit", {"answer": "4"}, 30.0, "gw")
    assert json.loads(raw) == [inbox.VERSION, "call", ["sid-1", "task-1", "submit", {"answer": "4"}, 30.0, "gw"]]
    assert inbox.parse(raw) == ("call", ["sid-1", "task-1", "submit", {"answer": "4"}, 30.0, "gw"])


@pytest.mark.parametrize("raw", [b"garbage", b"{}", b"[1, \"exec\", []]", b"[2, \"call\", []]", b"[1, \"call\", {}]",
                                 b"[1, \"call\"]"])
def test_anything_else_is_refused_as_a_bad_message(raw):
    with pytest.raises(inbox.BadMessage):
        inbox.parse(raw)


def test_an_unknown_op_is_never_sent():
    with pytest.raises(ValueError):
        inbox.message("exec", "rm -rf /")


def test_a_node_drops_unreadable_messages_and_goes_on_with_the_next_oldest_first(cluster):
    hostname = cluster.start_runner()
    key = f"{cluster.prefix}:inbox:{hostname}"
    # Pushed on the left, taken from the right: garbage first, then two teardowns.
    cluster.redis.lpush(key, b"garbage", b"[1, \"exec\", []]", inbox.message("teardown", "first"),
                        inbox.message("teardown", "second"))
    for sid in ("first", "second"):
        wait_until(lambda sid=sid: cluster.redis.get(f"{cluster.prefix}:state:{sid}"), 30, f"teardown of {sid}")
    assert cluster.redis.llen(key) == 0
    assert cluster.runners[hostname].poll() is None  # still running
    log = (cluster.tmp / f"{hostname.partition('@')[0]}.log").read_text()
    assert "unreadable runner message" in log and "not a runner message" in log
