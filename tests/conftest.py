import os
import uuid

# Shared limit counters in Redis (CI sets REDIS_URL) must not leak between test runs.
os.environ.setdefault("ORS_REDIS_PREFIX", f"ors-test-{uuid.uuid4().hex[:8]}")
# pytest-django has loaded the settings before this file runs, so they hold the variable's default
# ("ors"): set them too, or test runs in parallel on one Redis share their teams' session slots
# (same team ids in every test database) and refuse each other's episodes with 429.
from django.conf import settings  # noqa: E402

settings.ORS_REDIS_PREFIX = os.environ["ORS_REDIS_PREFIX"]

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
