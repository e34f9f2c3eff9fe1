import os
import uuid

# Shared limit counters in Redis (CI sets REDIS_URL) must not leak between test runs.
os.environ.setdefault("ORS_REDIS_PREFIX", f"ors-test-{uuid.uuid4().hex[:8]}")

pytest_plugins = [
    "tests.fixtures.database",
    "tests.fixtures.tenancy",
    "tests.fixtures.ors",
    "tests.fixtures.server",
    "tests.fixtures.celery",
    "tests.fixtures.tcp_proxy",
    "tests.fixtures.server_database",
]

# tests/stack runs against docker/compose.yml on real containers: `make stack-test` (bin/stack-test)
# brings the stack up and sets ORS_STACK; `make test` leaves it out.
collect_ignore = [] if os.environ.get("ORS_STACK") else ["stack"]
