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
    "tests.fixtures.tiers",
]
