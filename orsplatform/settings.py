"""The one settings module. Embedded defaults run on one box with no services (SQLite, in-process
limits, inline executor); environment variables switch on production pieces."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import dj_database_url
from csp.constants import NONCE, NONE, SELF

from orsplatform.deployment import DEVELOPMENT_SECRET_KEY, refuse_insecure_deployment
from orsplatform.runners.sandbox.config import env_setting as sandbox_setting

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("ORS_VAR_DIR", BASE_DIR / "var"))


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    return float(value) if value not in (None, "") else default


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else default


# Off unless asked for: with DEBUG on, Django records every SQL query, which costs the hot path
# about a fifth of its database time.
DEBUG = env_bool("DEBUG", False)
# --- Accounts and the perimeter (docs/accounts.md) --------------------------------------------------
# The embedded default is for a developer's box. A deployment (SECRET_KEY set, ORS_SECURE_COOKIES on, or
# ORS_DEPLOYMENT=production) must set its own SECRET_KEY and ALLOWED_HOSTS, and neither SECRET_KEY nor
# ORS_AGENT_KEY_SECRET may be the development key: otherwise importing these settings refuses to start
# anything (uvicorn, daphne, manage.py, Celery) with a message that says what to set.
refuse_insecure_deployment(os.environ)
SECRET_KEY = os.environ.get("SECRET_KEY", DEVELOPMENT_SECRET_KEY)
# Any Host only on the embedded default; a deployment names its hosts (required above).
ALLOWED_HOSTS = [h.strip() for h in os.environ.get("ALLOWED_HOSTS", "*").split(",") if h.strip()]
# ------------------------------------------------------------------------------------------------------
# `make run` prints a one-time sign-in link and password for the built-in team's owner. Only on the
# embedded default: a deployment sets its own SECRET_KEY, which switches this off unless asked for.
ORS_DEV_LOGIN = env_bool("ORS_DEV_LOGIN", "SECRET_KEY" not in os.environ)
# Pages with a run in progress refetch their figures this often (seconds).
ORS_LIVE_REFRESH_SECONDS = env_int("ORS_LIVE_REFRESH_SECONDS", 10)
CSRF_TRUSTED_ORIGINS = [o for o in os.environ.get("CSRF_TRUSTED_ORIGINS", "").split(",") if o]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "orsplatform.teams",
    "orsplatform.catalog",
    "orsplatform.episodes",
    "orsplatform.console",
    "orsplatform.analytics",
    "orsplatform.runners",  # its beat tasks (runners/tasks.py); no models
    "orsplatform.hub",
    "orsplatform.evals",  # AAP agents, evaluation runs and leaderboards
    "orsplatform.verify",  # verified versions: replay of recorded episodes, reference solutions
    "orsplatform.runs",  # training runs and the rollouts the openreward client logs
    "orsplatform.flags",  # reward-hacking and anomaly flags over a team's episodes
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "axes",  # sign-in lockout (accounts block below)
    "csp",  # Content-Security-Policy with nonces (accounts block below)
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",  # nosniff, and HSTS behind TLS
    "csp.middleware.CSPMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "axes.middleware.AxesMiddleware",  # last: turns a locked-out sign-in into the lockout page
]

ROOT_URLCONF = "orsplatform.urls"
ASGI_APPLICATION = "orsplatform.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "orsplatform.hub.context.site",
            ],
        },
    },
]

DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get("DATABASE_URL", f"sqlite:///{VAR_DIR / 'db.sqlite3'}"),
        # Under ASGI a persistent connection per request thread would pin connections to open
        # streams; the hot path keeps its own long-lived connection on the DB thread instead.
        conn_max_age=0,
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # A file (not :memory:) so that a server subprocess started by a test sees the test database.
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / "test-db.sqlite3")}
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 20,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }

if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # A database host that stops answering fails a request in seconds (503 + Retry-After) instead
    # of holding it forever; DATABASE_URL's own ?connect_timeout= wins.
    DATABASES["default"].setdefault("OPTIONS", {}).setdefault(
        "connect_timeout", env_int("ORS_DB_CONNECT_TIMEOUT_SECONDS", 5))

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True
STATIC_URL = "/static/"
STATIC_ROOT = VAR_DIR / "static"
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # whitenoise warns about a missing root
# Serve app static files straight from their folders, so no collectstatic step is needed.
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/console/"
LOGOUT_REDIRECT_URL = "/"

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["orsplatform.api.auth.ApiKeyAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": [],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": None,
    "EXCEPTION_HANDLER": "orsplatform.api.errors.exception_handler",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "ORS Platform API",
    "DESCRIPTION": "Catalog and audit log of the ORS Platform. The ORS protocol itself is served at the root.",
    "VERSION": "1",
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # OpenAPI links (what to call next with what an answer names): orsplatform/api/schema_links.py.
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums",
                             "orsplatform.api.schema_links.add_links"],
}

REDIS_URL = os.environ.get("REDIS_URL", "")
ORS_REDIS_PREFIX = os.environ.get("ORS_REDIS_PREFIX", "ors")  # namespaces shared limit counters

CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", REDIS_URL or "memory://")
# Without a broker (the embedded default) tasks run eagerly, in the caller's process.
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", not os.environ.get("CELERY_BROKER_URL"))
CELERY_TASK_EAGER_PROPAGATES = True
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("CELERY_TASK_DEFAULT_QUEUE", "celery")  # platform tasks
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BEAT_SCHEDULE: dict = {
    # The celery executor's housekeeping (no-ops with the inline executor: no runner sessions).
    "reap-idle-sessions": {"task": "runners.reap_idle_sessions",
                           "schedule": env_float("ORS_REAP_EVERY_SECONDS", 5.0)},
    "fail-lost-runners": {"task": "runners.fail_lost_runners",
                          "schedule": env_float("ORS_REAP_EVERY_SECONDS", 5.0)},
    "finish-orphaned-calls": {"task": "runners.finish_orphaned_calls",
                              "schedule": env_float("ORS_SWEEP_EVERY_SECONDS", 30.0)},
    # Folds new tool calls into the analytics rollups (bounded batches; a backlog re-queues itself).
    "analytics-rollup": {"task": "analytics.rollup_tool_calls", "schedule": 30.0},
    # Builds whose process died end as failed; Python environments no version uses are removed.
    "collect-pyenvs": {"task": "catalog.collect_pyenvs", "schedule": 600.0},
    # Staged uploads and ingest jobs or builds left by a killed process (bounded batches).
    "cleanup-staged": {"task": "catalog.cleanup_staged", "schedule": env_float("ORS_CLEANUP_EVERY_SECONDS", 300.0)},
    # Evaluation runs whose worker died are resumed on another (or failed, when they need secrets).
    "resume-orphaned-eval-runs": {"task": "evals.resume_orphaned_runs", "schedule": 30.0},
    # Reward-hacking and anomaly flags over the recent episodes (bounded: ORS_FLAGS_MAX_SESSIONS a pass).
    "compute-flags": {"task": "flags.compute", "schedule": env_float("ORS_FLAGS_EVERY_SECONDS", 300.0)},
}

# --- Flags (orsplatform/flags/services.py says what each one means) ---------------------------------
ORS_FLAGS_WINDOW_DAYS = env_float("ORS_FLAGS_WINDOW_DAYS", 7.0)
ORS_FLAGS_MAX_SESSIONS = int(env_float("ORS_FLAGS_MAX_SESSIONS", 200_000))
ORS_FLAGS_MIN_EPISODES = int(env_float("ORS_FLAGS_MIN_EPISODES", 5))
ORS_FLAGS_FAST_PASS_RATIO = env_float("ORS_FLAGS_FAST_PASS_RATIO", 0.34)
ORS_FLAGS_JUMP = env_float("ORS_FLAGS_JUMP", 0.5)
ORS_FLAGS_MIN_CALLS = int(env_float("ORS_FLAGS_MIN_CALLS", 20))
ORS_FLAGS_ERROR_RATE = env_float("ORS_FLAGS_ERROR_RATE", 0.2)

# --- ORS platform settings ------------------------------------------------------------------------
ORS_EXECUTOR = os.environ.get("ORS_EXECUTOR", "inline")
# Idle sessions are torn down after this long without a request carrying their id (ORS: 15 min).
ORS_IDLE_TIMEOUT_SECONDS = env_float("ORS_IDLE_TIMEOUT_SECONDS", 15 * 60)
ORS_REAPER_INTERVAL_SECONDS = env_float("ORS_REAPER_INTERVAL_SECONDS", 5.0)
# How long a request waits for setup() before answering 503 starting (the reference waits 25 s).
ORS_SETUP_WAIT_SECONDS = env_float("ORS_SETUP_WAIT_SECONDS", 25.0)
# SSE comment pings while a tool runs; the openreward client gives up after 30 s of silence.
ORS_SSE_PING_SECONDS = env_float("ORS_SSE_PING_SECONDS", 5.0)
# Finished call results stay in memory this long for reconnects (then the audit row serves them).
ORS_RESULT_LINGER_SECONDS = env_float("ORS_RESULT_LINGER_SECONDS", 120.0)
# Activity (pings) is kept in memory and written in bulk this often; idle expiry sees it then.
ORS_ACTIVITY_FLUSH_SECONDS = env_float("ORS_ACTIVITY_FLUSH_SECONDS", 30.0)
# Celery executor: how long a gateway trusts its copy of another gateway's session row, how often
# a waiting call re-reads the durable result (a lost wake-up costs at most this), how long a
# request waits for a runner's reply, and when a runner without a heartbeat counts as lost.
ORS_SESSION_CACHE_SECONDS = env_float("ORS_SESSION_CACHE_SECONDS", 1.0)
ORS_RUNNER_POLL_SECONDS = env_float("ORS_RUNNER_POLL_SECONDS", 1.0)
ORS_RUNNER_REPLY_TIMEOUT_SECONDS = env_float("ORS_RUNNER_REPLY_TIMEOUT_SECONDS", 60.0)
ORS_RUNNER_GRACE_SECONDS = env_float("ORS_RUNNER_GRACE_SECONDS", 2.0)
ORS_RUNNER_HEARTBEAT_TTL = env_float("ORS_RUNNER_HEARTBEAT_TTL", 5.0)  # as the nodes set it (node.py)
ORS_STATE_TTL_SECONDS = env_float("ORS_STATE_TTL_SECONDS", 86400.0)  # session records in Redis
ORS_RESULT_TTL_SECONDS = env_float("ORS_RESULT_TTL_SECONDS", 3600.0)  # runners' results kept in Redis
# A running call whose gateway has not recorded it after this long is recorded by the sweeper.
ORS_ORPHAN_AFTER_SECONDS = env_float("ORS_ORPHAN_AFTER_SECONDS", 30.0)
ORS_MAX_BODY_BYTES = env_int("ORS_MAX_BODY_BYTES", 10 * 1024 * 1024)
# The perimeter (orsplatform/perimeter/, docs/perimeter.md). A request's headers must arrive within
# the header timeout; a process keeps at most ORS_MAX_CONNECTIONS client connections, never closer
# than ORS_FD_HEADROOM to its open-files limit, shedding idle ones first. Django paths take bodies of
# at most ORS_MAX_REQUEST_BYTES (counted as received, below FILE_UPLOAD_MAX_MEMORY_SIZE so nothing
# is spooled to disk); only a signed-in member's or a team key's upload routes take the upload limits.
# A request body that makes no progress for ORS_BODY_TIMEOUT_SECONDS is closed (and an anonymous
# stalled one is shed at the cap). WebSockets are never shed, so a new one is refused once they and
# requests in flight would leave fewer than ORS_CONNECTION_RESERVE places for everyone else (/health).
ORS_HEADER_TIMEOUT_SECONDS = env_float("ORS_HEADER_TIMEOUT_SECONDS", 10.0)
ORS_BODY_TIMEOUT_SECONDS = env_float("ORS_BODY_TIMEOUT_SECONDS", 30.0)
ORS_MAX_CONNECTIONS = env_int("ORS_MAX_CONNECTIONS", 32768)
ORS_FD_HEADROOM = env_int("ORS_FD_HEADROOM", 256)
ORS_CONNECTION_RESERVE = env_int("ORS_CONNECTION_RESERVE", 256)
ORS_MAX_REQUEST_BYTES = env_int("ORS_MAX_REQUEST_BYTES", 1024 * 1024)
# The Rollout API (POST /v1/rollouts, docs/runs.md): the openreward client's batches are at most
# 1 MB of events (one larger event goes alone), so a body may be 2 MiB as sent (still held in
# memory, FILE_UPLOAD_MAX_MEMORY_SIZE) and, gzipped, 16 MiB once decompressed.
ORS_ROLLOUT_MAX_BODY_BYTES = env_int("ORS_ROLLOUT_MAX_BODY_BYTES", 2 * 1024 * 1024)
ORS_ROLLOUT_MAX_JSON_BYTES = env_int("ORS_ROLLOUT_MAX_JSON_BYTES", 16 * 1024 * 1024)
# Threads (each with its own database connection) writing Rollout API batches at once.
ORS_ROLLOUT_WRITER_THREADS = env_int("ORS_ROLLOUT_WRITER_THREADS", 8)
# On PostgreSQL the hot path's writes run on the event loop (psycopg async), not on a DB thread.
ORS_PG_ASYNC_WRITES = env_bool("ORS_PG_ASYNC_WRITES", True)
ORS_MAX_HEADER_BYTES = env_int("ORS_MAX_HEADER_BYTES", 16 * 1024)
ORS_MAX_LIST_TASKS = env_int("ORS_MAX_LIST_TASKS", 100_000)
ORS_TOOL_THREADS = env_int("ORS_TOOL_THREADS", 64)  # per sandbox worker
# Sandbox workers (runners/sandbox/): the defaults live in runners/sandbox/config.py so runner nodes,
# which have no Django settings, read the same names with the same defaults.
ORS_SANDBOX = sandbox_setting("ORS_SANDBOX")  # bwrap | none (tenants NOT isolated; said at every start)
ORS_SANDBOX_BWRAP = sandbox_setting("ORS_SANDBOX_BWRAP")
ORS_SANDBOX_ALLOW_NETWORK = sandbox_setting("ORS_SANDBOX_ALLOW_NETWORK")  # may a manifest ask for network?
ORS_SANDBOX_SESSIONS_PER_WORKER = sandbox_setting("ORS_SANDBOX_SESSIONS_PER_WORKER")
ORS_SANDBOX_MAX_WORKERS_PER_KEY = sandbox_setting("ORS_SANDBOX_MAX_WORKERS_PER_KEY")
ORS_SANDBOX_IDLE_SECONDS = sandbox_setting("ORS_SANDBOX_IDLE_SECONDS")
ORS_SANDBOX_GRACE_SECONDS = sandbox_setting("ORS_SANDBOX_GRACE_SECONDS")
ORS_SANDBOX_START_SECONDS = sandbox_setting("ORS_SANDBOX_START_SECONDS")
# A worker's limits: the manifest's [sandbox] requests up to the MAX_ values, else the defaults.
ORS_SANDBOX_MEMORY_MB = sandbox_setting("ORS_SANDBOX_MEMORY_MB")
ORS_SANDBOX_MAX_MEMORY_MB = sandbox_setting("ORS_SANDBOX_MAX_MEMORY_MB")
ORS_SANDBOX_CPU_SECONDS = sandbox_setting("ORS_SANDBOX_CPU_SECONDS")
ORS_SANDBOX_MAX_CPU_SECONDS = sandbox_setting("ORS_SANDBOX_MAX_CPU_SECONDS")
ORS_SANDBOX_PROCESSES = sandbox_setting("ORS_SANDBOX_PROCESSES")
ORS_SANDBOX_MAX_PROCESSES = sandbox_setting("ORS_SANDBOX_MAX_PROCESSES")
ORS_SANDBOX_OPEN_FILES = sandbox_setting("ORS_SANDBOX_OPEN_FILES")
ORS_SANDBOX_MAX_OPEN_FILES = sandbox_setting("ORS_SANDBOX_MAX_OPEN_FILES")
ORS_SANDBOX_TMP_MB = sandbox_setting("ORS_SANDBOX_TMP_MB")
ORS_SANDBOX_MAX_TMP_MB = sandbox_setting("ORS_SANDBOX_MAX_TMP_MB")
# Each worker's CPU weight in its own cgroup (docs/sandbox.md): CPU is shared per worker.
ORS_SANDBOX_CPU_WEIGHT = sandbox_setting("ORS_SANDBOX_CPU_WEIGHT")
# All workers together against the platform's own processes (100 each): the platform runs first.
ORS_SANDBOX_TOTAL_CPU_WEIGHT = sandbox_setting("ORS_SANDBOX_TOTAL_CPU_WEIGHT")
# The tenant record (docs/tenant-record.md). A sandbox worker's channel: an answer (tool output,
# prompt, task tools) over ORS_MAX_TOOL_OUTPUT_BYTES ends its request with an error and the audit
# log keeps its first ORS_AUDIT_TRUNCATED_BYTES; a frame over ORS_MAX_FRAME_BYTES, one unfinished
# after ORS_FRAME_DEADLINE_SECONDS, or one answering no request kills the worker. Runner nodes read
# the same variables (runners/sandbox/framing.py holds the defaults).
from orsplatform.runners.sandbox.framing import channel_setting  # noqa: E402

ORS_MAX_TOOL_OUTPUT_BYTES = channel_setting("ORS_MAX_TOOL_OUTPUT_BYTES")
ORS_MAX_FRAME_BYTES = channel_setting("ORS_MAX_FRAME_BYTES")
ORS_FRAME_DEADLINE_SECONDS = channel_setting("ORS_FRAME_DEADLINE_SECONDS")
ORS_AUDIT_TRUNCATED_BYTES = channel_setting("ORS_AUDIT_TRUNCATED_BYTES")
# Teams whose environments may receive any secret a caller sends, as a team's own environments do
# (comma-separated slugs; default the platform's builtin team, whose environments the operator
# publishes). Any other team's environment receives only the secrets its manifest declares in
# required_secrets; a /create sending others is refused (400).
ORS_SECRETS_TRUSTED_TEAMS = [t.strip() for t in os.environ.get("ORS_SECRETS_TRUSTED_TEAMS", os.environ.get(
    "ORS_BUILTIN_TEAM", "builtin")).split(",") if t.strip()]
ORS_DEFAULT_TOOL_TIMEOUT_SECONDS = env_float("ORS_DEFAULT_TOOL_TIMEOUT_SECONDS", 600.0)
# --- Verified versions (docs/verified-versions.md) ------------------------------------------------------
# Recorded episodes of the current version replayed against a new one, unless the environment's
# settings or its manifest's [verify] sample say otherwise (0: none); an author may ask for at most MAX.
ORS_REPLAY_DEFAULT_SAMPLE = env_int("ORS_REPLAY_DEFAULT_SAMPLE", 100)
ORS_REPLAY_MAX_SAMPLE = env_int("ORS_REPLAY_MAX_SAMPLE", 5000)
# The sample is drawn from the most recent POOL x sample ended episodes (bounded reads on big histories).
ORS_REPLAY_SAMPLE_POOL = env_int("ORS_REPLAY_SAMPLE_POOL", 10)
# Episodes replayed at once (they share the version's sandbox workers: one per
# ORS_SANDBOX_SESSIONS_PER_WORKER of them); how often the progress bar's row is written.
ORS_REPLAY_CONCURRENCY = env_int("ORS_REPLAY_CONCURRENCY", 32)
ORS_REPLAY_PROGRESS_SECONDS = env_float("ORS_REPLAY_PROGRESS_SECONDS", 0.5)
# A replay still "running" after this long lost its process; a redelivery of its task runs it again.
ORS_REPLAY_STALE_SECONDS = env_float("ORS_REPLAY_STALE_SECONDS", 3600.0)
# verify/solutions.jsonl: at most this many reference solutions and bytes.
ORS_REPLAY_MAX_SOLUTIONS = env_int("ORS_REPLAY_MAX_SOLUTIONS", 1000)
ORS_REPLAY_MAX_SOLUTIONS_BYTES = env_int("ORS_REPLAY_MAX_SOLUTIONS_BYTES", 4 * 1024 * 1024)
# Environment used by clients that name none (ors.client's split+index form); "team/slug".
ORS_DEFAULT_ENVIRONMENT = os.environ.get("ORS_DEFAULT_ENVIRONMENT", "builtin/math")
ORS_BUILTIN_TEAM = os.environ.get("ORS_BUILTIN_TEAM", "builtin")
# Anonymous callers: may they read public catalogs? may they run sessions?
ORS_ANONYMOUS_CATALOG = env_bool("ORS_ANONYMOUS_CATALOG", True)
ORS_ANONYMOUS_SESSIONS = env_bool("ORS_ANONYMOUS_SESSIONS", False)
# Seconds a verified API key is trusted from the in-process cache before it is looked up again.
ORS_AUTH_CACHE_SECONDS = env_float("ORS_AUTH_CACHE_SECONDS", 2.0)
# --- Authorization caps (docs/authorization.md) -------------------------------------------------------
# Open OpenEnv sockets are also re-checked every ORS_AUTH_CACHE_SECONDS: a revoked key's close (4401).
# Per API key and gateway process (anonymous callers share one count): open OpenEnv sockets (idle
# ones included) and MCP sessions; past them a new one is refused (CAPACITY_REACHED, 4429).
ORS_OPENENV_MAX_SOCKETS_PER_KEY = env_int("ORS_OPENENV_MAX_SOCKETS_PER_KEY", 16384)
ORS_OPENENV_MAX_MCP_SESSIONS_PER_KEY = env_int("ORS_OPENENV_MAX_MCP_SESSIONS_PER_KEY", 16384)
# The hub's "Render prompt" runs tenant code in a sandbox child: concurrent renders per signed-in
# user and per team of the user (shared through Redis when REDIS_URL is set); past them 429.
ORS_PROMPT_RENDERS_PER_USER = env_int("ORS_PROMPT_RENDERS_PER_USER", 2)
ORS_PROMPT_RENDERS_PER_TEAM = env_int("ORS_PROMPT_RENDERS_PER_TEAM", 4)
ORS_CATALOG_CACHE_SECONDS = env_float("ORS_CATALOG_CACHE_SECONDS", 2.0)
ORS_PACKAGE_DIR = Path(os.environ.get("ORS_PACKAGE_DIR", VAR_DIR / "packages"))
ORS_ENVS_DIR = Path(os.environ.get("ORS_ENVS_DIR", BASE_DIR / "envs"))
ORS_INSPECT_TIMEOUT_SECONDS = env_float("ORS_INSPECT_TIMEOUT_SECONDS", 120.0)
# Publishing limits. Tenant code is validated in a subprocess with these caps (wall time above,
# address space and file size here); uploads above the byte limits answer 413.
ORS_INSPECT_MEMORY_BYTES = env_int("ORS_INSPECT_MEMORY_BYTES", 1024 * 1024 * 1024)
ORS_INSPECT_FILE_BYTES = env_int("ORS_INSPECT_FILE_BYTES", 1024 * 1024 * 1024)
# What a validation child may hand back over its pipe (its report and the tasks its class lists,
# which the platform writes to a folder of its own): past it the child is stopped and the publish
# fails; larger task sets belong in task files. docs/sandbox-inspection.md.
ORS_INSPECT_RESULT_BYTES = env_int("ORS_INSPECT_RESULT_BYTES", 128 * 1024 * 1024)
ORS_MAX_PACKAGE_BYTES = env_int("ORS_MAX_PACKAGE_BYTES", 64 * 1024 * 1024)
ORS_MAX_PACKAGE_UNPACKED_BYTES = env_int("ORS_MAX_PACKAGE_UNPACKED_BYTES", 512 * 1024 * 1024)
ORS_MAX_PACKAGE_FILES = env_int("ORS_MAX_PACKAGE_FILES", 5000)
ORS_MAX_COMPRESSION_RATIO = env_int("ORS_MAX_COMPRESSION_RATIO", 200)
ORS_MAX_TASK_FILE_BYTES = env_int("ORS_MAX_TASK_FILE_BYTES", 4 * 1024 * 1024 * 1024)
ORS_MAX_TASK_BYTES = env_int("ORS_MAX_TASK_BYTES", 8 * 1024 * 1024)  # one task (one JSONL line)
ORS_UPLOAD_DIR = Path(os.environ.get("ORS_UPLOAD_DIR", VAR_DIR / "uploads"))
# Data archives uploaded beside a package (docs/data.md): stored once by content hash in
# ORS_DATA_DIR (shared with runner nodes like ORS_PACKAGE_DIR) and mounted read-only at /orwd_data.
ORS_DATA_DIR = Path(os.environ.get("ORS_DATA_DIR", VAR_DIR / "data"))
ORS_MAX_DATA_ARCHIVE_BYTES = env_int("ORS_MAX_DATA_ARCHIVE_BYTES", 1024 * 1024 * 1024)
ORS_MAX_DATA_UNPACKED_BYTES = env_int("ORS_MAX_DATA_UNPACKED_BYTES", 8 * 1024 * 1024 * 1024)
ORS_MAX_DATA_FILES = env_int("ORS_MAX_DATA_FILES", 100_000)
# Large uploads stream to disk instead of memory; task files are read from there, never whole.
FILE_UPLOAD_MAX_MEMORY_SIZE = 2 * 1024 * 1024
# The perimeter of uploads and ingest (docs/uploads.md). A package's paths: at most this deep and
# this long (each component at most 255 bytes); directories count as entries of ORS_MAX_PACKAGE_FILES
# and 4 KiB each of ORS_MAX_PACKAGE_UNPACKED_BYTES. Tasks: at most this many in one split and in all
# of a team's splits (an ingest past either is refused whole with 413).
ORS_MAX_PACKAGE_PATH_DEPTH = env_int("ORS_MAX_PACKAGE_PATH_DEPTH", 32)
ORS_MAX_PACKAGE_PATH_BYTES = env_int("ORS_MAX_PACKAGE_PATH_BYTES", 1024)
ORS_MAX_TASKS_PER_SPLIT = env_int("ORS_MAX_TASKS_PER_SPLIT", 1_000_000)
# The row check of a task upload (catalog/row_check.py): how many rows (the first, and others at
# random) run through the environment's setup() and get_prompt() in the sandbox before the upload
# is accepted (0: none), and how long the check of all of them may take.
ORS_TASK_CHECK_ROWS = env_int("ORS_TASK_CHECK_ROWS", 20)
ORS_TASK_CHECK_TIMEOUT_SECONDS = env_float("ORS_TASK_CHECK_TIMEOUT_SECONDS", 120.0)
ORS_MAX_TASKS_PER_TEAM = env_int("ORS_MAX_TASKS_PER_TEAM", 5_000_000)
# Staged uploads older than this (files in ORS_UPLOAD_DIR no queued or running ingest job holds, and
# half-stored packages) are removed by `manage.py cleanup_staged` and the catalog.cleanup_staged beat
# task (every ORS_CLEANUP_EVERY_SECONDS); an ingest job `running` this long with no live process is failed.
ORS_STAGED_MAX_AGE_SECONDS = env_float("ORS_STAGED_MAX_AGE_SECONDS", 6 * 3600.0)
ORS_CLEANUP_BATCH = env_int("ORS_CLEANUP_BATCH", 500)

# Packages with requirements (requirements.txt, pyproject.toml, manifest `requirements`) run in a
# Python environment built for them by uv in the sandbox (catalog/pyenvs.py), reaching only the
# registry's hosts. Identical requirement sets share one environment; unused ones are removed.
ORS_PYENV_DIR = Path(os.environ.get("ORS_PYENV_DIR", VAR_DIR / "pyenvs"))
# uv's cache inside the environments' folder: one filesystem and one mount in the build sandbox,
# so installs are hard links into the cache rather than copies.
ORS_UV_CACHE_DIR = Path(os.environ.get("ORS_UV_CACHE_DIR", ORS_PYENV_DIR / ".uv-cache"))
ORS_BUILD_LOG_DIR = Path(os.environ.get("ORS_BUILD_LOG_DIR", VAR_DIR / "builds"))
ORS_BUILD_INDEX_URL = os.environ.get("ORS_BUILD_INDEX_URL", "https://pypi.org/simple")
ORS_BUILD_ALLOWED_HOSTS = [h.strip() for h in os.environ.get(
    "ORS_BUILD_ALLOWED_HOSTS", "pypi.org,files.pythonhosted.org").split(",") if h.strip()]
# The OpenEnv SDK version an environment that requires openenv (or openenv-core) is built with: the
# one the sandbox's OpenEnv adapter (runners/sandbox/openenv_host.py) is written against.
ORS_OPENENV_VERSION = os.environ.get("ORS_OPENENV_VERSION", "0.10.0")
ORS_BUILD_TIMEOUT_SECONDS = env_float("ORS_BUILD_TIMEOUT_SECONDS", 900.0)
ORS_BUILD_MEMORY_MB = env_int("ORS_BUILD_MEMORY_MB", 4096)
ORS_BUILD_DISK_MB = env_int("ORS_BUILD_DISK_MB", 4096)  # one environment's files, and any one file
# An operator's own indexes (comma-separated), searched before ORS_BUILD_INDEX_URL (uv's first-index
# strategy: a name found on one is never looked up on a later one); plain http:// is allowed for them.
ORS_BUILD_EXTRA_INDEX_URLS = [u.strip() for u in os.environ.get("ORS_BUILD_EXTRA_INDEX_URLS", "").split(",")
                              if u.strip()]
# A requirement published only as a source distribution is built into a wheel in a sandbox of its
# own (no shared cache, a throwaway private one; docs/sdists.md); 0 keeps builds wheels-only.
ORS_BUILD_SDISTS = env_bool("ORS_BUILD_SDISTS", True)
ORS_BUILD_MAX_SDISTS = env_int("ORS_BUILD_MAX_SDISTS", 8)  # source builds in one environment's build
ORS_BUILD_MAX_SDIST_BYTES = env_int("ORS_BUILD_MAX_SDIST_BYTES", 256 * 1024 * 1024)  # one downloaded sdist
# An environment no version uses is removed after this long (a build in progress is never).
ORS_PYENV_GRACE_SECONDS = env_float("ORS_PYENV_GRACE_SECONDS", 3600.0)

# --- Evaluations (orsplatform/evals): the platform as an AAP v1 application --------------------------
# Key material for agents' API keys and runs' secrets at rest (Fernet); set it in production so that
# rotating SECRET_KEY does not make stored agent keys unreadable.
ORS_AGENT_KEY_SECRET = os.environ.get("ORS_AGENT_KEY_SECRET", SECRET_KEY)
# Agent URLs are team-supplied, so the platform fetching them is an SSRF surface (docs/agent-egress.md).
# Comma-separated entries agents may live at: host, host:port, IP, IP:port, [v6]:port, CIDR, CIDR:port;
# an entry without a port admits ports 80 and 443 only. Empty: any host whose every address is public.
# Judged on the address each connection is opened to; IPv6 forms that embed an IPv4 address (mapped,
# NAT64, 6to4, Teredo) are always refused.
ORS_EVAL_AGENT_ALLOWED_HOSTS = [h.strip() for h in os.environ.get("ORS_EVAL_AGENT_ALLOWED_HOSTS", "").split(",")
                                if h.strip()]
ORS_EVAL_CONNECT_TIMEOUT_SECONDS = env_float("ORS_EVAL_CONNECT_TIMEOUT_SECONDS", 10.0)
# The whole of GET /meta (registration, "Ping /meta"), however slowly the agent answers: it runs in a
# web request's thread, which a trickling agent must not hold.
ORS_EVAL_META_TIMEOUT_SECONDS = env_float("ORS_EVAL_META_TIMEOUT_SECONDS", 10.0)
# What the platform reads of an agent's replies; past a cap it stops reading and the call fails.
ORS_EVAL_MAX_META_BYTES = env_int("ORS_EVAL_MAX_META_BYTES", 1 << 20)
ORS_EVAL_MAX_TURN_BYTES = env_int("ORS_EVAL_MAX_TURN_BYTES", 16 << 20)  # one turn's reply (JSON or stream)
ORS_EVAL_MAX_SSE_LINE_BYTES = env_int("ORS_EVAL_MAX_SSE_LINE_BYTES", 4 << 20)
ORS_EVAL_MAX_EVENT_BYTES = env_int("ORS_EVAL_MAX_EVENT_BYTES", 4 << 20)  # one event, all its lines
# Longest silence on an agent's response (between bytes of a stream) before the turn fails.
ORS_EVAL_READ_TIMEOUT_SECONDS = env_float("ORS_EVAL_READ_TIMEOUT_SECONDS", 120.0)
# Longest turn, whatever the agent sends meanwhile (a stream that never ends).
ORS_EVAL_TURN_TIMEOUT_SECONDS = env_float("ORS_EVAL_TURN_TIMEOUT_SECONDS", 600.0)
# How long an episode waits for one of the team's open-session slots before it is scored failed.
ORS_EVAL_CAPACITY_WAIT_SECONDS = env_float("ORS_EVAL_CAPACITY_WAIT_SECONDS", 900.0)
ORS_EVAL_MAX_CONCURRENCY = env_int("ORS_EVAL_MAX_CONCURRENCY", 64)
ORS_EVAL_MAX_EPISODES = env_int("ORS_EVAL_MAX_EPISODES", 100_000)
# A driving worker renews its lease on the run this often; a lease not renewed for
# ORS_EVAL_LEASE_SECONDS belongs to a dead worker, and the run may be taken over (resume).
ORS_EVAL_LEASE_SECONDS = env_float("ORS_EVAL_LEASE_SECONDS", 30.0)
# A cancel that finds an agent's PUT /session in flight waits this long (at most a turn) for the
# session's id, so the agent's session is deleted rather than left open on its server.
ORS_EVAL_CANCEL_GRACE_SECONDS = env_float("ORS_EVAL_CANCEL_GRACE_SECONDS", 15.0)

# --- Accounts: passwords, sign-in lockout, Content-Security-Policy (docs/accounts.md) -------------------
# Wherever the platform sets a password (add_member, the admin, dev_key) Django's four validators judge it.
AUTH_PASSWORD_VALIDATORS: list[dict] = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator",
     "OPTIONS": {"min_length": env_int("ORS_PASSWORD_MIN_LENGTH", 10)}},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
# django-axes checks every sign-in (the login page, the admin's) before the password is: after
# ORS_LOGIN_FAILURE_LIMIT wrong passwords for one username from one address, that pair is refused,
# right password included, until ORS_LOGIN_COOLOFF_SECONDS pass without another try. Counts live in
# the database, so every gateway process (and the embedded SQLite default) shares them.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = env_int("ORS_LOGIN_FAILURE_LIMIT", 5)
AXES_COOLOFF_TIME = timedelta(seconds=env_float("ORS_LOGIN_COOLOFF_SECONDS", 15 * 60))
# Keyed on the pair, so an attacker cannot lock a user out from elsewhere, nor spread guesses over
# many usernames from one address without each one counting.
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_CALLABLE = "orsplatform.lockout.locked_out"  # the login page's frame, 429, how long to wait
# The client address is the connection's (REMOTE_ADDR), never a header a client can forge; behind a
# proxy, start uvicorn with --proxy-headers --forwarded-allow-ips=<proxy> so the ASGI client is the
# real one.
AXES_IPWARE_META_PRECEDENCE_ORDER = ["REMOTE_ADDR"]
AXES_VERBOSE = False  # no start-up banner, no user agents in its log lines; lockouts are still logged
# One strict policy for every Django page: scripts and styles only from this site or inline with the
# response's nonce (templates write <script nonce="{{ request.csp_nonce }}">; no style attributes), no
# plugins, no framing, no <base> hijack, forms post only here. Images may also be data: URIs (prompt
# image blocks) and https: (README images).
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF, NONCE],
        "style-src": [SELF, NONCE],  # the nonce: only Swagger UI's page has an inline <style>
        "img-src": [SELF, "data:", "https:"],
        "connect-src": [SELF],
        "font-src": [SELF],
        "object-src": [NONE],
        "base-uri": [SELF],
        "frame-ancestors": [NONE],
        "form-action": [SELF],
    },
}
# X-Content-Type-Options: nosniff on every Django response (Django's default, stated because the
# REST API relies on it); the ORS and OpenEnv faces add it themselves (orsplatform/ors/http.py).
SECURE_CONTENT_TYPE_NOSNIFF = True
# ------------------------------------------------------------------------------------------------------

# Behind TLS in production: cookies only over HTTPS, HSTS, and the proxy's scheme header trusted.
if env_bool("ORS_SECURE_COOKIES", False):
    SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = True
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 3600)
SESSION_COOKIE_HTTPONLY = True

LOG_LEVEL = os.environ.get("ORS_LOG_LEVEL", "INFO")
# ORS_LOG_FORMAT=json gives one JSON object a line (for log shippers); plain text otherwise.
LOG_FORMAT = os.environ.get("ORS_LOG_FORMAT", "plain")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
        "json": {"()": "orsplatform.logs.JsonFormatter"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": LOG_FORMAT}},
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    # httpx logs every request at INFO: one line per AAP turn of every evaluation episode.
    "loggers": {"django.db.backends": {"level": "WARNING"}, "httpx": {"level": "WARNING"}},
}
