import os
import uuid

# Shared limit counters in Redis (CI sets REDIS_URL) must not leak between test runs.
os.environ.setdefault("ORS_REDIS_PREFIX", f"ors-test-{uuid.uuid4().hex[:8]}")
# Test configuration, not a mode of the platform: a task queued by the code under test runs in the
# caller (and in the servers tests start, which inherit this). Tests of background work as it
# really runs start a worker (tests/fixtures/celery.py: Cluster, EmbeddedWorker).
os.environ.setdefault("CELERY_TASK_ALWAYS_EAGER", "true")
# The platform's default (auto) is gVisor where runsc runs; the suite's is bubblewrap (a worker starts
# in a tenth of the time), and the sandbox tests run under each runtime through their `runtime`
# fixture (tests/executors/conftest.py), gVisor included, whatever this says.
os.environ.setdefault("ORS_SANDBOX", "bwrap")

# pytest-django has loaded the settings before this file runs, so they hold the variable's default
# ("ors"): set them too, or test runs in parallel on one Redis share their teams' session slots
# (same team ids in every test database) and refuse each other's episodes with 429.
from django.conf import settings  # noqa: E402

settings.ORS_REDIS_PREFIX = os.environ["ORS_REDIS_PREFIX"]
settings.ORS_SANDBOX = os.environ["ORS_SANDBOX"]

pytest_plugins = [
    "tests.fixtures.database",
    "tests.fixtures.tenancy",
    "tests.fixtures.ors",
    "tests.fixtures.server",
    "tests.fixtures.celery",
    "tests.fixtures.tcp_proxy",
    "tests.fixtures.server_database",
    "tests.fixtures.tiers",
    "tests.fixtures.runtimes",
    "tests.fixtures.cpu",
]

# tests/stack runs against docker/compose.yml on real containers: `make stack-test` (bin/stack-test)
# brings the stack up and sets ORS_STACK; `make test` leaves it out.
collect_ignore = [] if os.environ.get("ORS_STACK") else ["stack"]

def pytest_configure(config) -> None:
    # pytest-django loads the settings before this file: the same configuration for this process.
    from django.conf import settings

    settings.CELERY_TASK_ALWAYS_EAGER = os.environ["CELERY_TASK_ALWAYS_EAGER"].strip().lower() in {"1", "true", "yes"}
