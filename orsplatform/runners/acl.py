"""Create (or update) the runner nodes' Redis ACL user: ``python -m orsplatform.runners.acl``.

Reads REDIS_URL (an administrative user's), ORS_REDIS_PREFIX, RUNNER_REDIS_USER (default
``ors-runner``) and RUNNER_REDIS_PASSWORD. Compose runs it after migrations; run it again after a
Redis restart when Redis keeps no ACL file. No Django here.
"""

from __future__ import annotations

import os
import sys

import redis

from orsplatform.runners.keys import runner_acl_rules


def main() -> int:
    password = os.environ.get("RUNNER_REDIS_PASSWORD", "")
    if not password:
        print("RUNNER_REDIS_PASSWORD is not set: runner nodes would share the platform's Redis user.",
              file=sys.stderr)
        return 1
    user = os.environ.get("RUNNER_REDIS_USER", "ors-runner")
    client = redis.Redis.from_url(os.environ["REDIS_URL"])
    client.execute_command("ACL", "SETUSER", user, *runner_acl_rules(os.environ.get("ORS_REDIS_PREFIX", "ors"),
                                                                      password))
    print(f"Redis ACL user {user!r} set for the runner nodes.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
