"""Create (or update) each runner node's own Redis ACL user:

    python -m orsplatform.executors.acl runner-1@runner-1 runner-2@runner-2

One argument per node, its name (``--hostname``). The node's user is
``ors-runner-<node>`` (the node name, before ``@``; node names must differ), with the rules of
keys.runner_acl_rules for that hostname only, and the password in ``RUNNER_REDIS_PASSWORD_<NODE>``
(upper case, other characters as ``_``: ``runner-1`` reads ``RUNNER_REDIS_PASSWORD_RUNNER_1``). Reads REDIS_URL (an administrative
user's) and ORS_REDIS_PREFIX. Compose runs it after migrations; run it again after a Redis restart
when Redis keeps no ACL file; when it keeps one (``aclfile``, as docker/compose.yml's Redis does), the
users are saved to it (``ACL SAVE``: password hashes only), so a Redis restart keeps them. No Django here.
"""

from __future__ import annotations

import os
import re
import sys

import redis

from orsplatform import config
from orsplatform.executors.keys import runner_acl_rules


def node_name(hostname: str) -> str:
    return hostname.partition("@")[0]


def user_name(hostname: str) -> str:
    return f"ors-runner-{node_name(hostname)}"


def password_variable(hostname: str) -> str:
    return "RUNNER_REDIS_PASSWORD_" + re.sub(r"[^A-Za-z0-9]", "_", node_name(hostname)).upper()


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    if len({password_variable(h) for h in argv}) < len(argv):
        print("Two runner nodes have the same node name: each needs a user (and password) of its own.",
              file=sys.stderr)
        return 2
    missing = [password_variable(h) for h in argv if not os.environ.get(password_variable(h))]
    if missing:
        print(f"Not set: {', '.join(missing)} (each runner node needs a password of its own).", file=sys.stderr)
        return 1
    env = config.load_or_exit(os.environ, program="orsplatform.executors.acl")  # the registry's checks and defaults
    if not env["REDIS_URL"]:
        print("Not set: REDIS_URL (an administrative Redis user's URL).", file=sys.stderr)
        return 1
    client = redis.Redis.from_url(env["REDIS_URL"])
    prefix = env["ORS_REDIS_PREFIX"]
    for hostname in argv:
        rules = runner_acl_rules(prefix, os.environ[password_variable(hostname)], hostname)
        client.execute_command("ACL", "SETUSER", user_name(hostname), *rules)
        print(f"Redis ACL user {user_name(hostname)!r} set for runner node {hostname}.")
    # Saved where Redis keeps an ACL file: without it a restarted Redis would refuse every node.
    if (client.config_get("aclfile") or {}).get("aclfile"):
        client.execute_command("ACL", "SAVE")
        print("Redis ACL users saved to its ACL file.")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
