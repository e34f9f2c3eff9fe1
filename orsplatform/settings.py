"""The one settings module. Embedded defaults run on one box with no services (SQLite, in-process
limits, inline executor); environment variables switch on production pieces."""

from __future__ import annotations

import os
import sys
from datetime import timedelta
from pathlib import Path

import dj_database_url
from csp.constants import NONCE, NONE, SELF
from django.core.exceptions import ImproperlyConfigured

from orsplatform import config
from orsplatform.deployment import refuse_insecure_deployment

BASE_DIR = Path(__file__).resolve().parent.parent
# Every variable below is declared, typed and documented once, in orsplatform/config.py (which also
# writes docs/configuration.md); a value it does not allow stops every process that imports these
# settings (uvicorn, daphne, manage.py, Celery) with a message naming the variable and what it allows.
try:
    env = config.load(os.environ)
except config.ConfigError as exc:
    raise ImproperlyConfigured(str(exc)) from None
for _typo in config.typos(os.environ):  # before logging is configured, so straight to stderr
    print(f"orsplatform.settings: warning: {_typo}", file=sys.stderr)
VAR_DIR = env["ORS_VAR_DIR"]

# Off unless asked for: with DEBUG on, Django records every SQL query, which costs the hot path
# about a fifth of its database time.
DEBUG = env["DEBUG"]
# --- Accounts and the perimeter (docs/accounts.md) --------------------------------------------------
# The embedded default is for a developer's box. A deployment (SECRET_KEY set, ORS_SECURE_COOKIES on, or
# ORS_DEPLOYMENT=production) must set its own SECRET_KEY and ALLOWED_HOSTS, and neither SECRET_KEY nor
# ORS_AGENT_KEY_SECRET may be the development key: otherwise importing these settings refuses to start
# anything (uvicorn, daphne, manage.py, Celery) with a message that says what to set.
refuse_insecure_deployment(os.environ)
SECRET_KEY = env["SECRET_KEY"]
# Any Host only on the embedded default; a deployment names its hosts (required above).
ALLOWED_HOSTS = env["ALLOWED_HOSTS"]
# ------------------------------------------------------------------------------------------------------
# `make run` prints a one-time sign-in link and password for the built-in team's owner. Only on the
# embedded default: a deployment sets its own SECRET_KEY, which switches this off unless asked for.
ORS_DEV_LOGIN = env["ORS_DEV_LOGIN"]
# Pages with a run in progress refetch their figures this often (seconds).
ORS_LIVE_REFRESH_SECONDS = env["ORS_LIVE_REFRESH_SECONDS"]
CSRF_TRUSTED_ORIGINS = env["CSRF_TRUSTED_ORIGINS"]

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
    "orsplatform.executors",  # its beat tasks (executors/tasks.py); no models
    "orsplatform.hub",
    "orsplatform.evals",  # AAP agents, evaluation runs and leaderboards
    "orsplatform.verify",  # verified versions: replay of recorded episodes, reference solutions
    "orsplatform.runs",  # training runs and the rollouts the openreward client logs
    "orsplatform.flags",  # reward-hacking and anomaly flags over a team's episodes
    "orsplatform.auditlog",  # the audit log's partitions, retention and archive
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
        env["DATABASE_URL"],
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
        "connect_timeout", env["ORS_DB_CONNECT_TIMEOUT_SECONDS"])

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
    # JSON through the platform's bounded decoder (depth, no NaN/Infinity): a 400, never a 500.
    "DEFAULT_PARSER_CLASSES": ["orsplatform.api.parsers.BoundedJSONParser", "rest_framework.parsers.FormParser",
                               "rest_framework.parsers.MultiPartParser"],
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

REDIS_URL = env["REDIS_URL"]
ORS_REDIS_PREFIX = env["ORS_REDIS_PREFIX"]  # namespaces shared limit counters

# Background work always goes through the broker to a worker (docs/runner-nodes.md). Without Redis
# or a broker configured (the embedded default), the broker is Celery's filesystem transport: a
# folder, nothing to install or start; `make run` starts a worker with beat on it beside the server.
CELERY_BROKER_URL = env["CELERY_BROKER_URL"]
ORS_BROKER_DIR = env["ORS_BROKER_DIR"]
if CELERY_BROKER_URL.startswith("filesystem://"):
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        # One folder both ways: every process (server, worker) sends and receives on it.
        "data_folder_in": str(ORS_BROKER_DIR / "queue"), "data_folder_out": str(ORS_BROKER_DIR / "queue"),
        "control_folder": str(ORS_BROKER_DIR / "control"),
    }
    (ORS_BROKER_DIR / "queue").mkdir(parents=True, exist_ok=True)
# Only tests set this (tests/conftest.py runs their tasks in the caller): it is no mode of the platform.
CELERY_TASK_ALWAYS_EAGER = env["CELERY_TASK_ALWAYS_EAGER"]
CELERY_TASK_EAGER_PROPAGATES = True
CELERY_TASK_DEFAULT_QUEUE = env["CELERY_TASK_DEFAULT_QUEUE"]  # platform tasks
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Where environments run: "inline" (in the server's process, under the sandbox) or "celery" (on
# runner nodes, docs/runner-nodes.md).
ORS_EXECUTOR = env["ORS_EXECUTOR"]
CELERY_BEAT_SCHEDULE: dict = {
    # Folds new tool calls into the analytics rollups (bounded batches; a backlog re-queues itself).
    "analytics-rollup": {"task": "analytics.rollup_tool_calls", "schedule": 30.0},
    # Folds ended sessions into the session rollups (the same way).
    "analytics-session-rollup": {"task": "analytics.rollup_sessions", "schedule": 30.0},
    # Builds whose process died end as failed; Python environments no version uses are removed.
    "collect-pyenvs": {"task": "catalog.collect_pyenvs", "schedule": 600.0},
    # Staged uploads and ingest jobs or builds left by a killed process (bounded batches).
    "cleanup-staged": {"task": "catalog.cleanup_staged", "schedule": env["ORS_CLEANUP_EVERY_SECONDS"]},
    # Evaluation runs whose worker died are resumed on another (or failed, when they need secrets).
    "resume-orphaned-eval-runs": {"task": "evals.resume_orphaned_runs", "schedule": 30.0},
    # Reward-hacking and anomaly flags over the recent episodes (bounded: ORS_FLAGS_MAX_SESSIONS a pass).
    "compute-flags": {"task": "flags.compute", "schedule": env["ORS_FLAGS_EVERY_SECONDS"]},
    # The audit log's partitions ahead, then retention and archiving (docs/audit-log.md).
    "audit-maintain": {"task": "auditlog.maintain", "schedule": env["ORS_AUDIT_MAINTAIN_EVERY_SECONDS"]},
}
if ORS_EXECUTOR == "celery":
    # The celery executor's housekeeping, over Redis (the inline executor has no runner sessions).
    CELERY_BEAT_SCHEDULE |= {
        "reap-idle-sessions": {"task": "runners.reap_idle_sessions",
                               "schedule": env["ORS_REAP_EVERY_SECONDS"]},
        "fail-lost-runners": {"task": "runners.fail_lost_runners",
                              "schedule": env["ORS_REAP_EVERY_SECONDS"]},
        "finish-orphaned-calls": {"task": "runners.finish_orphaned_calls",
                                  "schedule": env["ORS_SWEEP_EVERY_SECONDS"]},
    }

# --- Flags (orsplatform/flags/services.py says what each one means) ---------------------------------
ORS_FLAGS_WINDOW_DAYS = env["ORS_FLAGS_WINDOW_DAYS"]
ORS_FLAGS_MAX_SESSIONS = env["ORS_FLAGS_MAX_SESSIONS"]
ORS_FLAGS_MIN_EPISODES = env["ORS_FLAGS_MIN_EPISODES"]
ORS_FLAGS_FAST_PASS_RATIO = env["ORS_FLAGS_FAST_PASS_RATIO"]
ORS_FLAGS_JUMP = env["ORS_FLAGS_JUMP"]
ORS_FLAGS_MIN_CALLS = env["ORS_FLAGS_MIN_CALLS"]
ORS_FLAGS_ERROR_RATE = env["ORS_FLAGS_ERROR_RATE"]

# --- The audit log (docs/audit-log.md) ---
ORS_AUDIT_PARTITIONS_AHEAD_DAYS = env["ORS_AUDIT_PARTITIONS_AHEAD_DAYS"]
ORS_AUDIT_RETENTION_DAYS = env["ORS_AUDIT_RETENTION_DAYS"]
ORS_AUDIT_ARCHIVE_DIR = env["ORS_AUDIT_ARCHIVE_DIR"]
ORS_AUDIT_ARCHIVE_URL = env["ORS_AUDIT_ARCHIVE_URL"]
ORS_AUDIT_ARCHIVE_S3_ENDPOINT = env["ORS_AUDIT_ARCHIVE_S3_ENDPOINT"]
ORS_AUDIT_ARCHIVE_LAG_DAYS = env["ORS_AUDIT_ARCHIVE_LAG_DAYS"]
ORS_AUDIT_LOCK_TIMEOUT_SECONDS = env["ORS_AUDIT_LOCK_TIMEOUT_SECONDS"]

# An episode passes when its total reward reaches this (analytics, run pages, flags).
ORS_ANALYTICS_PASS_REWARD = env["ORS_ANALYTICS_PASS_REWARD"]

# --- ORS platform settings ------------------------------------------------------------------------
# Idle sessions are torn down after this long without a request carrying their id (ORS: 15 min).
ORS_IDLE_TIMEOUT_SECONDS = env["ORS_IDLE_TIMEOUT_SECONDS"]
ORS_REAPER_INTERVAL_SECONDS = env["ORS_REAPER_INTERVAL_SECONDS"]
# How long a request waits for setup() before answering 503 starting (the reference waits 25 s).
ORS_SETUP_WAIT_SECONDS = env["ORS_SETUP_WAIT_SECONDS"]
# SSE comment pings while a tool runs; the openreward client gives up after 30 s of silence.
ORS_SSE_PING_SECONDS = env["ORS_SSE_PING_SECONDS"]
# Finished call results stay in memory this long for reconnects (then the audit row serves them).
ORS_RESULT_LINGER_SECONDS = env["ORS_RESULT_LINGER_SECONDS"]
# Activity (pings) is kept in memory and written in bulk this often; idle expiry sees it then.
ORS_ACTIVITY_FLUSH_SECONDS = env["ORS_ACTIVITY_FLUSH_SECONDS"]
# Celery executor: how long a gateway trusts its copy of another gateway's session row, how often
# a waiting call re-reads the durable result (a lost wake-up costs at most this), how long a
# request waits for a runner's reply, and when a runner without a heartbeat counts as lost.
ORS_SESSION_CACHE_SECONDS = env["ORS_SESSION_CACHE_SECONDS"]
ORS_RUNNER_POLL_SECONDS = env["ORS_RUNNER_POLL_SECONDS"]
ORS_RUNNER_REPLY_TIMEOUT_SECONDS = env["ORS_RUNNER_REPLY_TIMEOUT_SECONDS"]
ORS_RUNNER_GRACE_SECONDS = env["ORS_RUNNER_GRACE_SECONDS"]
ORS_RUNNER_HEARTBEAT_TTL = env["ORS_RUNNER_HEARTBEAT_TTL"]  # as the nodes set it (node.py)
ORS_STATE_TTL_SECONDS = env["ORS_STATE_TTL_SECONDS"]  # session records in Redis
ORS_RESULT_TTL_SECONDS = env["ORS_RESULT_TTL_SECONDS"]  # runners' results kept in Redis
# A running call whose gateway has not recorded it after this long is recorded by the sweeper.
ORS_ORPHAN_AFTER_SECONDS = env["ORS_ORPHAN_AFTER_SECONDS"]
ORS_MAX_BODY_BYTES = env["ORS_MAX_BODY_BYTES"]
# The perimeter (orsplatform/perimeter/, docs/perimeter.md). A request's headers must arrive within
# the header timeout; a process keeps at most ORS_MAX_CONNECTIONS client connections, never closer
# than ORS_FD_HEADROOM to its open-files limit, shedding idle ones first. Django paths take bodies of
# at most ORS_MAX_REQUEST_BYTES (counted as received, below FILE_UPLOAD_MAX_MEMORY_SIZE so nothing
# is spooled to disk); only a signed-in member's or a team key's upload routes take the upload limits.
# A request body that makes no progress for ORS_BODY_TIMEOUT_SECONDS is closed (and an anonymous
# stalled one is shed at the cap). WebSockets are never shed, so a new one is refused once they and
# requests in flight would leave fewer than ORS_CONNECTION_RESERVE places for everyone else (/health).
ORS_HEADER_TIMEOUT_SECONDS = env["ORS_HEADER_TIMEOUT_SECONDS"]
ORS_BODY_TIMEOUT_SECONDS = env["ORS_BODY_TIMEOUT_SECONDS"]
ORS_MAX_CONNECTIONS = env["ORS_MAX_CONNECTIONS"]
ORS_FD_HEADROOM = env["ORS_FD_HEADROOM"]
ORS_CONNECTION_RESERVE = env["ORS_CONNECTION_RESERVE"]
ORS_MAX_REQUEST_BYTES = env["ORS_MAX_REQUEST_BYTES"]
# The server's garbage collector (orsplatform/perimeter/heap.py): the start-up heap frozen, and a
# young generation of ORS_GC_YOUNG_THRESHOLD objects (CPython's default is 700), so full collections
# of a heap holding thousands of sockets are rare instead of a stall every few seconds. 0 keeps
# CPython's threshold.
ORS_GC_FREEZE = env["ORS_GC_FREEZE"]
ORS_GC_YOUNG_THRESHOLD = env["ORS_GC_YOUNG_THRESHOLD"]
# The Rollout API (POST /v1/rollouts, docs/runs.md): the openreward client's batches are at most
# 1 MB of events (one larger event goes alone), so a body may be 2 MiB as sent (still held in
# memory, FILE_UPLOAD_MAX_MEMORY_SIZE) and, gzipped, 16 MiB once decompressed.
ORS_ROLLOUT_MAX_BODY_BYTES = env["ORS_ROLLOUT_MAX_BODY_BYTES"]
ORS_ROLLOUT_MAX_JSON_BYTES = env["ORS_ROLLOUT_MAX_JSON_BYTES"]
# Threads (each with its own database connection) writing Rollout API batches at once.
ORS_ROLLOUT_WRITER_THREADS = env["ORS_ROLLOUT_WRITER_THREADS"]
# On PostgreSQL the hot path's writes run on the event loop (psycopg async), not on a DB thread.
ORS_PG_ASYNC_WRITES = env["ORS_PG_ASYNC_WRITES"]
ORS_MAX_HEADER_BYTES = env["ORS_MAX_HEADER_BYTES"]
ORS_MAX_LIST_TASKS = env["ORS_MAX_LIST_TASKS"]
ORS_TOOL_THREADS = env["ORS_TOOL_THREADS"]  # per sandbox worker
# Sandbox workers (orsplatform/sandbox/): the defaults live in sandbox/config.py so runner nodes,
# which have no Django settings, read the same names with the same defaults.
ORS_SANDBOX = env["ORS_SANDBOX"]  # auto | gvisor | bwrap | none (tenants NOT isolated; said at every start)
ORS_GVISOR_RUNSC = env["ORS_GVISOR_RUNSC"]
ORS_GVISOR_PLATFORM = env["ORS_GVISOR_PLATFORM"]
ORS_SANDBOX_BWRAP = env["ORS_SANDBOX_BWRAP"]
ORS_SANDBOX_ALLOW_NETWORK = env["ORS_SANDBOX_ALLOW_NETWORK"]  # may a manifest ask for network?
ORS_SANDBOX_SESSIONS_PER_WORKER = env["ORS_SANDBOX_SESSIONS_PER_WORKER"]
ORS_SANDBOX_MAX_WORKERS_PER_KEY = env["ORS_SANDBOX_MAX_WORKERS_PER_KEY"]
ORS_SANDBOX_IDLE_SECONDS = env["ORS_SANDBOX_IDLE_SECONDS"]
ORS_SANDBOX_GRACE_SECONDS = env["ORS_SANDBOX_GRACE_SECONDS"]
ORS_SANDBOX_START_SECONDS = env["ORS_SANDBOX_START_SECONDS"]
# A worker's limits: the manifest's [sandbox] requests up to the MAX_ values, else the defaults.
ORS_SANDBOX_MEMORY_MB = env["ORS_SANDBOX_MEMORY_MB"]
ORS_SANDBOX_MAX_MEMORY_MB = env["ORS_SANDBOX_MAX_MEMORY_MB"]
ORS_SANDBOX_CPU_SECONDS = env["ORS_SANDBOX_CPU_SECONDS"]
ORS_SANDBOX_MAX_CPU_SECONDS = env["ORS_SANDBOX_MAX_CPU_SECONDS"]
ORS_SANDBOX_PROCESSES = env["ORS_SANDBOX_PROCESSES"]
ORS_SANDBOX_MAX_PROCESSES = env["ORS_SANDBOX_MAX_PROCESSES"]
ORS_SANDBOX_OPEN_FILES = env["ORS_SANDBOX_OPEN_FILES"]
ORS_SANDBOX_MAX_OPEN_FILES = env["ORS_SANDBOX_MAX_OPEN_FILES"]
ORS_SANDBOX_TMP_MB = env["ORS_SANDBOX_TMP_MB"]
ORS_SANDBOX_MAX_TMP_MB = env["ORS_SANDBOX_MAX_TMP_MB"]
# Each worker's CPU weight in its own cgroup (docs/sandbox.md): CPU is shared per worker.
ORS_SANDBOX_CPU_WEIGHT = env["ORS_SANDBOX_CPU_WEIGHT"]
# All workers together against the platform's own processes (100 each): the platform runs first.
ORS_SANDBOX_TOTAL_CPU_WEIGHT = env["ORS_SANDBOX_TOTAL_CPU_WEIGHT"]
# A worker keeping a CPU busy weighs ORS_SANDBOX_BUSY_CPU_WEIGHT until calm (docs/sandbox.md).
ORS_SANDBOX_BUSY_CPU = env["ORS_SANDBOX_BUSY_CPU"]
ORS_SANDBOX_BUSY_CPU_WEIGHT = env["ORS_SANDBOX_BUSY_CPU_WEIGHT"]
ORS_SANDBOX_BUSY_CPU_IDLE = env["ORS_SANDBOX_BUSY_CPU_IDLE"]
# The tenant record (docs/tenant-record.md). A sandbox worker's channel: an answer (tool output,
# prompt, task tools) over ORS_MAX_TOOL_OUTPUT_BYTES ends its request with an error and the audit
# log keeps its first ORS_AUDIT_TRUNCATED_BYTES; a frame over ORS_MAX_FRAME_BYTES, one unfinished
# after ORS_FRAME_DEADLINE_SECONDS, or one answering no request kills the worker. Runner nodes read
# the same variables (sandbox/framing.py holds the defaults).
ORS_MAX_TOOL_OUTPUT_BYTES = env["ORS_MAX_TOOL_OUTPUT_BYTES"]
ORS_MAX_FRAME_BYTES = env["ORS_MAX_FRAME_BYTES"]
ORS_FRAME_DEADLINE_SECONDS = env["ORS_FRAME_DEADLINE_SECONDS"]
ORS_AUDIT_TRUNCATED_BYTES = env["ORS_AUDIT_TRUNCATED_BYTES"]
# Teams whose environments may receive any secret a caller sends, as a team's own environments do
# (comma-separated slugs; default the platform's builtin team, whose environments the operator
# publishes). Any other team's environment receives only the secrets its manifest declares in
# required_secrets; a /create sending others is refused (400).
ORS_SECRETS_TRUSTED_TEAMS = env["ORS_SECRETS_TRUSTED_TEAMS"]
ORS_DEFAULT_TOOL_TIMEOUT_SECONDS = env["ORS_DEFAULT_TOOL_TIMEOUT_SECONDS"]
# --- Verified versions (docs/verified-versions.md) ------------------------------------------------------
# Recorded episodes of the current version replayed against a new one, unless the environment's
# settings or its manifest's [verify] sample say otherwise (0: none); an author may ask for at most MAX.
ORS_REPLAY_DEFAULT_SAMPLE = env["ORS_REPLAY_DEFAULT_SAMPLE"]
ORS_REPLAY_MAX_SAMPLE = env["ORS_REPLAY_MAX_SAMPLE"]
# The sample is drawn from the most recent POOL x sample ended episodes (bounded reads on big histories).
ORS_REPLAY_SAMPLE_POOL = env["ORS_REPLAY_SAMPLE_POOL"]
# Episodes replayed at once (they share the version's sandbox workers: one per
# ORS_SANDBOX_SESSIONS_PER_WORKER of them); how often the progress bar's row is written.
ORS_REPLAY_CONCURRENCY = env["ORS_REPLAY_CONCURRENCY"]
ORS_REPLAY_PROGRESS_SECONDS = env["ORS_REPLAY_PROGRESS_SECONDS"]
# A replay still "running" after this long lost its process; a redelivery of its task runs it again.
ORS_REPLAY_STALE_SECONDS = env["ORS_REPLAY_STALE_SECONDS"]
# verify/solutions.jsonl: at most this many reference solutions and bytes.
ORS_REPLAY_MAX_SOLUTIONS = env["ORS_REPLAY_MAX_SOLUTIONS"]
ORS_REPLAY_MAX_SOLUTIONS_BYTES = env["ORS_REPLAY_MAX_SOLUTIONS_BYTES"]
# Environment used by clients that name none (ors.client's split+index form); "team/slug".
ORS_DEFAULT_ENVIRONMENT = env["ORS_DEFAULT_ENVIRONMENT"]
ORS_BUILTIN_TEAM = env["ORS_BUILTIN_TEAM"]
# Anonymous callers: may they read public catalogs? may they run sessions?
ORS_ANONYMOUS_CATALOG = env["ORS_ANONYMOUS_CATALOG"]
ORS_ANONYMOUS_SESSIONS = env["ORS_ANONYMOUS_SESSIONS"]
# Seconds a verified API key is trusted from the in-process cache before it is looked up again.
ORS_AUTH_CACHE_SECONDS = env["ORS_AUTH_CACHE_SECONDS"]
# --- Authorization caps (docs/authorization.md) -------------------------------------------------------
# Open OpenEnv sockets are also re-checked every ORS_AUTH_CACHE_SECONDS: a revoked key's close (4401).
# Per API key and gateway process (anonymous callers share one count): open OpenEnv sockets (idle
# ones included) and MCP sessions; past them a new one is refused (CAPACITY_REACHED, 4429).
ORS_OPENENV_MAX_SOCKETS_PER_KEY = env["ORS_OPENENV_MAX_SOCKETS_PER_KEY"]
ORS_OPENENV_MAX_MCP_SESSIONS_PER_KEY = env["ORS_OPENENV_MAX_MCP_SESSIONS_PER_KEY"]
# The hub's "Render prompt" runs tenant code in a sandbox child: concurrent renders per signed-in
# user and per team of the user (shared through Redis when REDIS_URL is set); past them 429.
ORS_PROMPT_RENDERS_PER_USER = env["ORS_PROMPT_RENDERS_PER_USER"]
ORS_PROMPT_RENDERS_PER_TEAM = env["ORS_PROMPT_RENDERS_PER_TEAM"]
ORS_CATALOG_CACHE_SECONDS = env["ORS_CATALOG_CACHE_SECONDS"]
ORS_PACKAGE_DIR = env["ORS_PACKAGE_DIR"]
ORS_ENVS_DIR = env["ORS_ENVS_DIR"]
ORS_INSPECT_TIMEOUT_SECONDS = env["ORS_INSPECT_TIMEOUT_SECONDS"]
# Publishing limits. Tenant code is validated in a subprocess with these caps (wall time above,
# address space and file size here); uploads above the byte limits answer 413.
ORS_INSPECT_MEMORY_BYTES = env["ORS_INSPECT_MEMORY_BYTES"]
ORS_INSPECT_FILE_BYTES = env["ORS_INSPECT_FILE_BYTES"]
# What a validation child may hand back over its pipe (its report and the tasks its class lists,
# which the platform writes to a folder of its own): past it the child is stopped and the publish
# fails; larger task sets belong in task files. docs/sandbox-inspection.md.
ORS_INSPECT_RESULT_BYTES = env["ORS_INSPECT_RESULT_BYTES"]
ORS_MAX_PACKAGE_BYTES = env["ORS_MAX_PACKAGE_BYTES"]
ORS_MAX_PACKAGE_UNPACKED_BYTES = env["ORS_MAX_PACKAGE_UNPACKED_BYTES"]
ORS_MAX_PACKAGE_FILES = env["ORS_MAX_PACKAGE_FILES"]
ORS_MAX_COMPRESSION_RATIO = env["ORS_MAX_COMPRESSION_RATIO"]
ORS_MAX_TASK_FILE_BYTES = env["ORS_MAX_TASK_FILE_BYTES"]
ORS_MAX_TASK_BYTES = env["ORS_MAX_TASK_BYTES"]  # one task (one JSONL line)
ORS_UPLOAD_DIR = env["ORS_UPLOAD_DIR"]
# Data archives uploaded beside a package (docs/data.md): stored once by content hash in
# ORS_DATA_DIR (shared with runner nodes like ORS_PACKAGE_DIR) and mounted read-only at /orwd_data.
ORS_DATA_DIR = env["ORS_DATA_DIR"]
ORS_MAX_DATA_ARCHIVE_BYTES = env["ORS_MAX_DATA_ARCHIVE_BYTES"]
ORS_MAX_DATA_UNPACKED_BYTES = env["ORS_MAX_DATA_UNPACKED_BYTES"]
ORS_MAX_DATA_FILES = env["ORS_MAX_DATA_FILES"]
# Large uploads stream to disk instead of memory; task files are read from there, never whole.
FILE_UPLOAD_MAX_MEMORY_SIZE = 2 * 1024 * 1024
# The perimeter of uploads and ingest (docs/uploads.md). A package's paths: at most this deep and
# this long (each component at most 255 bytes); directories count as entries of ORS_MAX_PACKAGE_FILES
# and 4 KiB each of ORS_MAX_PACKAGE_UNPACKED_BYTES. Tasks: at most this many in one split and in all
# of a team's splits (an ingest past either is refused whole with 413).
ORS_MAX_PACKAGE_PATH_DEPTH = env["ORS_MAX_PACKAGE_PATH_DEPTH"]
ORS_MAX_PACKAGE_PATH_BYTES = env["ORS_MAX_PACKAGE_PATH_BYTES"]
ORS_MAX_TASKS_PER_SPLIT = env["ORS_MAX_TASKS_PER_SPLIT"]
ORS_MAX_TASKS_PER_TEAM = env["ORS_MAX_TASKS_PER_TEAM"]
# The row check of a task upload (catalog/row_check.py): how many rows (the first, and others at
# random) run through the environment's setup() and get_prompt() in the sandbox before the upload
# is accepted (0: none), and how long the check of all of them may take.
ORS_TASK_CHECK_ROWS = env["ORS_TASK_CHECK_ROWS"]
ORS_TASK_CHECK_TIMEOUT_SECONDS = env["ORS_TASK_CHECK_TIMEOUT_SECONDS"]
# Staged uploads older than this (files in ORS_UPLOAD_DIR no queued or running ingest job holds, and
# half-stored packages) are removed by `manage.py cleanup_staged` and the catalog.cleanup_staged beat
# task (every ORS_CLEANUP_EVERY_SECONDS); an ingest job `running` this long with no live process is failed.
ORS_STAGED_MAX_AGE_SECONDS = env["ORS_STAGED_MAX_AGE_SECONDS"]
ORS_CLEANUP_BATCH = env["ORS_CLEANUP_BATCH"]

# Packages with requirements (requirements.txt, pyproject.toml, manifest `requirements`) run in a
# Python environment built for them by uv in the sandbox (catalog/pyenvs.py), reaching only the
# registry's hosts. Identical requirement sets share one environment; unused ones are removed.
ORS_PYENV_DIR = env["ORS_PYENV_DIR"]
# uv's cache inside the environments' folder: one filesystem and one mount in the build sandbox,
# so installs are hard links into the cache rather than copies.
ORS_UV_CACHE_DIR = env["ORS_UV_CACHE_DIR"]
ORS_BUILD_LOG_DIR = env["ORS_BUILD_LOG_DIR"]
ORS_BUILD_INDEX_URL = env["ORS_BUILD_INDEX_URL"]
ORS_BUILD_ALLOWED_HOSTS = env["ORS_BUILD_ALLOWED_HOSTS"]
# The OpenEnv SDK version an environment that requires openenv (or openenv-core) is built with: the
# one the sandbox's OpenEnv adapter (sandbox/openenv_host.py) is written against.
ORS_OPENENV_VERSION = env["ORS_OPENENV_VERSION"]
ORS_BUILD_TIMEOUT_SECONDS = env["ORS_BUILD_TIMEOUT_SECONDS"]
ORS_BUILD_MEMORY_MB = env["ORS_BUILD_MEMORY_MB"]
ORS_BUILD_DISK_MB = env["ORS_BUILD_DISK_MB"]  # one environment's files, and any one file
# An operator's own indexes (comma-separated), searched before ORS_BUILD_INDEX_URL (uv's first-index
# strategy: a name found on one is never looked up on a later one); plain http:// is allowed for them.
ORS_BUILD_EXTRA_INDEX_URLS = env["ORS_BUILD_EXTRA_INDEX_URLS"]
# Container environments (orsplatform/containers/, docs/containers.md). The runtime side reads the
# same names from the process environment (runner nodes have no settings module of their own).
ORS_CONTAINERS_DIR = env["ORS_CONTAINERS_DIR"]
ORS_DOCKER_HOST = env["ORS_DOCKER_HOST"]
ORS_IMAGE_BUILD_ALLOWED_HOSTS = env["ORS_IMAGE_BUILD_ALLOWED_HOSTS"]
ORS_IMAGE_BUILD_HTTP_ORIGINS = env["ORS_IMAGE_BUILD_HTTP_ORIGINS"]
ORS_IMAGE_INSPECT_TIMEOUT_SECONDS = env["ORS_IMAGE_INSPECT_TIMEOUT_SECONDS"]
ORS_CONTAINER_ARCHIVES = env["ORS_CONTAINER_ARCHIVES"]
# A started container per recently built or used version, ahead of its first session (containers/warm.py).
ORS_CONTAINER_WARM_VERSIONS = env["ORS_CONTAINER_WARM_VERSIONS"]
ORS_CONTAINER_WARM_PER_TEAM = env["ORS_CONTAINER_WARM_PER_TEAM"]
ORS_CONTAINER_WARM_IDLE_SECONDS = env["ORS_CONTAINER_WARM_IDLE_SECONDS"]
ORS_CONTAINER_WARM_CHECK_SECONDS = env["ORS_CONTAINER_WARM_CHECK_SECONDS"]
# A requirement published only as a source distribution is built into a wheel in a sandbox of its
# own (no shared cache, a throwaway private one; docs/sdists.md); 0 keeps builds wheels-only.
ORS_BUILD_SDISTS = env["ORS_BUILD_SDISTS"]
ORS_BUILD_MAX_SDISTS = env["ORS_BUILD_MAX_SDISTS"]  # source builds in one environment's build
ORS_BUILD_MAX_SDIST_BYTES = env["ORS_BUILD_MAX_SDIST_BYTES"]  # one downloaded sdist
# An environment no version uses is removed after this long (a build in progress is never).
ORS_PYENV_GRACE_SECONDS = env["ORS_PYENV_GRACE_SECONDS"]

# --- Evaluations (orsplatform/evals): the platform as an AAP v1 application --------------------------
# Key material for agents' API keys and runs' secrets at rest (Fernet); set it in production so that
# rotating SECRET_KEY does not make stored agent keys unreadable.
ORS_AGENT_KEY_SECRET = env["ORS_AGENT_KEY_SECRET"]
# Agent URLs are team-supplied, so the platform fetching them is an SSRF surface (docs/agent-egress.md).
# Comma-separated entries agents may live at: host, host:port, IP, IP:port, [v6]:port, CIDR, CIDR:port;
# an entry without a port admits ports 80 and 443 only. Empty: any host whose every address is public.
# Judged on the address each connection is opened to; IPv6 forms that embed an IPv4 address (mapped,
# NAT64, 6to4, Teredo) are always refused.
ORS_EVAL_AGENT_ALLOWED_HOSTS = env["ORS_EVAL_AGENT_ALLOWED_HOSTS"]
ORS_EVAL_CONNECT_TIMEOUT_SECONDS = env["ORS_EVAL_CONNECT_TIMEOUT_SECONDS"]
# The whole of GET /meta (registration, "Ping /meta"), however slowly the agent answers: it runs in a
# web request's thread, which a trickling agent must not hold.
ORS_EVAL_META_TIMEOUT_SECONDS = env["ORS_EVAL_META_TIMEOUT_SECONDS"]
# What the platform reads of an agent's replies; past a cap it stops reading and the call fails.
ORS_EVAL_MAX_META_BYTES = env["ORS_EVAL_MAX_META_BYTES"]
ORS_EVAL_MAX_TURN_BYTES = env["ORS_EVAL_MAX_TURN_BYTES"]  # one turn's reply (JSON or stream)
ORS_EVAL_MAX_SSE_LINE_BYTES = env["ORS_EVAL_MAX_SSE_LINE_BYTES"]
ORS_EVAL_MAX_EVENT_BYTES = env["ORS_EVAL_MAX_EVENT_BYTES"]  # one event, all its lines
# Longest silence on an agent's response (between bytes of a stream) before the turn fails.
ORS_EVAL_READ_TIMEOUT_SECONDS = env["ORS_EVAL_READ_TIMEOUT_SECONDS"]
# Longest turn, whatever the agent sends meanwhile (a stream that never ends).
ORS_EVAL_TURN_TIMEOUT_SECONDS = env["ORS_EVAL_TURN_TIMEOUT_SECONDS"]
# How long an episode waits for one of the team's open-session slots before it is scored failed.
ORS_EVAL_CAPACITY_WAIT_SECONDS = env["ORS_EVAL_CAPACITY_WAIT_SECONDS"]
ORS_EVAL_MAX_CONCURRENCY = env["ORS_EVAL_MAX_CONCURRENCY"]
ORS_EVAL_MAX_EPISODES = env["ORS_EVAL_MAX_EPISODES"]
# A driving worker renews its lease on the run this often; a lease not renewed for
# ORS_EVAL_LEASE_SECONDS belongs to a dead worker, and the run may be taken over (resume).
ORS_EVAL_LEASE_SECONDS = env["ORS_EVAL_LEASE_SECONDS"]
# A cancel that finds an agent's PUT /session in flight waits this long (at most a turn) for the
# session's id, so the agent's session is deleted rather than left open on its server.
ORS_EVAL_CANCEL_GRACE_SECONDS = env["ORS_EVAL_CANCEL_GRACE_SECONDS"]

# --- Accounts: passwords, sign-in lockout, Content-Security-Policy (docs/accounts.md) -------------------
# Wherever the platform sets a password (add_member, the admin, dev_key) Django's four validators judge it.
AUTH_PASSWORD_VALIDATORS: list[dict] = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator",
     "OPTIONS": {"min_length": env["ORS_PASSWORD_MIN_LENGTH"]}},
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
AXES_FAILURE_LIMIT = env["ORS_LOGIN_FAILURE_LIMIT"]
AXES_COOLOFF_TIME = timedelta(seconds=env["ORS_LOGIN_COOLOFF_SECONDS"])
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
if env["ORS_SECURE_COOKIES"]:
    SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = True
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_HSTS_SECONDS = env["SECURE_HSTS_SECONDS"]
SESSION_COOKIE_HTTPONLY = True

LOG_LEVEL = env["ORS_LOG_LEVEL"].upper()
# ORS_LOG_FORMAT=json gives one JSON object a line (for log shippers); plain text otherwise.
LOG_FORMAT = env["ORS_LOG_FORMAT"]
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
