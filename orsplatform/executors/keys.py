"""The Redis names shared by gateways, runner nodes and the beat tasks (one place, so they agree).
No Django here: runner nodes import it without settings.

Nothing is ever found with SCAN: the keyspace holds a key per session and per call result, and a
SCAN every second per gateway over millions of them was the largest cost of the celery path. Sets
that must be listed (live runners, running calls) are kept as sorted sets next to their keys.
"""

from __future__ import annotations

import json
import time
from typing import Any

# A published message carries a payload (a call's result, a session's prompt) only up to this
# size; bigger ones are read from their durable key, so every gateway does not decode them.
INLINE_PAYLOAD_BYTES = 8 * 1024
# A session's record once it is torn down, expired or lost: no gateway serves it from Redis again.
GONE_RECORD = json.dumps({"state": "gone"})


class Keys:
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        # Sorted sets: member -> unix time of the last heartbeat / of the call's start.
        self.runners = f"{prefix}:runners"
        self.calls = f"{prefix}:running-calls"
        # Channels every gateway listens on (a pattern): session states, one channel per node that
        # publishes them (any gateway may await a setup). Per node so that a node's ACL user may use
        # its own channel only: Redis ACLs do not tell publishing from subscribing.
        self.sessions_pattern = f"{prefix}:sessions:*"

    def sessions(self, hostname: str) -> str:
        """The channel a node (or the platform's beat, hostname "platform") announces session states on."""
        return f"{self.prefix}:sessions:{hostname}"

    def inbox(self, hostname: str) -> str:
        """A node's inbox: the Redis list gateways push its work on (inbox.py)."""
        return f"{self.prefix}:inbox:{hostname}"

    def runner(self, hostname: str) -> str:
        """A node's heartbeat (JSON: boot, sessions, team, pid), with a TTL of a few heartbeats."""
        return f"{self.prefix}:runner:{hostname}"

    def missing(self, identity: str) -> str:
        """When the beat first found a runner's heartbeat missing (it waits out a grace period)."""
        return f"{self.prefix}:runner-missing:{identity}"

    def state(self, sid: str) -> str:
        """A session's shared record: setup state, who owns it (pk, team, version, runner), the
        initial prompt once setup is done; {"state": "gone"} once torn down."""
        return f"{self.prefix}:state:{sid}"

    def result(self, task_id: str) -> str:
        """A finished call's result as its runner left it (the durable hand-off)."""
        return f"{self.prefix}:result:{task_id}"

    def call(self, task_id: str) -> str:
        """A running call's marker (redacted audit data), kept by its gateway until its row is written."""
        return f"{self.prefix}:call:{task_id}"

    def slots(self, team_id: int) -> str:
        """A team's open-session slots (sorted set: sid -> when a gateway last vouched for it)."""
        return f"{self.prefix}:slots:{team_id}"

    def gateway(self, gateway: str, hostname: str) -> str:
        """A gateway's own channel from one node: replies and its calls' results (the gateway listens
        on gateway_pattern; a node may use only the channels that end in its own name)."""
        return f"{self.prefix}:gw:{gateway}:{hostname}"

    def gateway_pattern(self, gateway: str) -> str:
        return f"{self.prefix}:gw:{gateway}:*"


def runner_identity(hostname: str, boot: str) -> str:
    """One start of a runner node: its name and the random id it drew when it started. Sessions
    record this, not the name, so a node restarted under the same name (a container's restart
    policy, a supervisor) is another runner: its predecessor's sessions are lost, not served by an
    instance-less process, and messages still queued for them are dropped, not replayed."""
    return f"{hostname}#{boot}"


def runner_hostname(identity: str) -> str:
    """The node name (and so the inbox) of a runner identity."""
    return identity.partition("#")[0]


def heartbeat_identity(hostname: str, raw: bytes | None) -> str | None:
    """The identity a node's heartbeat value announces; None without a heartbeat."""
    return runner_identity(hostname, json.loads(raw).get("boot", "")) if raw else None


def live_runner_names(client: Any, keys: Keys, ttl: float) -> list[str]:
    """Names of nodes that beat within `ttl` seconds (sync client; the index may list a node whose
    heartbeat key has just expired, so callers that need certainty read the key)."""
    return [n.decode() for n in client.zrangebyscore(keys.runners, time.time() - ttl, "+inf")]


def decode(raw: bytes | None) -> dict | None:
    return json.loads(raw) if raw else None


def _glob(text: str) -> str:
    """`text` as a literal in a Redis ACL pattern."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def runner_acl_rules(prefix: str, password: str, hostname: str) -> list[str]:
    """Redis ACL rules (ACL SETUSER <name> ...) for one runner node's own user (executors/acl.py): what
    that node's inbox, heartbeat and replies need, and no more.

    - Its own inbox (`{prefix}:inbox:<hostname>`) and heartbeat only: it cannot read, take or feed
      another node's inbox.
    - Session records and call results are write-only: it cannot read another session's record or
      result, and their names (random ids) reach it only for its own sessions, because...
    - ...it may publish (and so subscribe) only on channels that end in its own name: the gateways
      listen on a pattern, so no node can listen to what another node tells them.
    - No MONITOR, KEYS, SCAN, FLUSH*, CONFIG, ACL, CLIENT LIST or scripts.
    The node index `{prefix}:runners` is shared (a sorted set of names, nothing secret)."""
    own = _glob(hostname)
    return [
        "reset", "on", f">{password}", "resetkeys", "resetchannels", "-@all",
        # connection and pipelines, the inbox's pops, the writes of records, results and heartbeats
        "+ping", "+echo", "+select", "+hello", "+auth", "+client|setname", "+client|id",
        "+multi", "+exec", "+discard",
        "+brpop", "+blmpop", "+llen",
        "+get", "+set", "+del", "+unlink", "+expire", "+pexpire", "+exists",
        "+zadd", "+zrem", "+zremrangebyscore", "+zrangebyscore",
        "+publish", "+subscribe", "+unsubscribe",
        f"~{_glob(prefix)}:runner:{own}", f"~{_glob(prefix)}:runners", f"~{_glob(prefix)}:inbox:{own}",
        f"%W~{_glob(prefix)}:state:*", f"%W~{_glob(prefix)}:result:*",
        f"&{_glob(prefix)}:gw:*:{own}", f"&{_glob(prefix)}:sessions:{own}",
    ]
