"""Every setting the platform reads from its environment: its type, default, what values it allows and
what it means. One registry, read by Django's settings, by the runner node (which has no Django, no
SECRET_KEY and no DATABASE_URL) and by the commands that generate docs/configuration.md.

A bad value stops start-up with a message naming the setting, the value and what is allowed, rather than
being read as something else (before this registry `DEBUG=ture` meant off and `ORS_SANDBOX=bwarp` failed
only when the first session started). `load()` checks every registered variable that is set, so one
start-up reports every mistake at once.

Standard library only, on purpose: runner nodes and the sandbox's supervisors import it, and nothing that
imports it may drag in Django, Celery or a library a tenant's Python environment might also carry.

Adding a setting (3 lines): a `Setting(...)` below, `NAME = env["NAME"]` in settings.py (or read from
`load()` in a Django-free process), and `python -m orsplatform.config --markdown > docs/configuration.md`
(tests/test_config.py fails until the committed page matches).
"""

from __future__ import annotations

import difflib
import math
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orsplatform.sandbox.config import DEFAULTS as SANDBOX_DEFAULTS
from orsplatform.sandbox.framing import DEFAULTS as CHANNEL_DEFAULTS

BASE_DIR = Path(__file__).resolve().parent.parent
MiB = 1024 * 1024
GiB = 1024 * MiB

# The key the embedded default signs with. It is public (it is in this file), so anything signed with it
# (sessions, password-reset links, agents' keys at rest) is forgeable: deployment.py refuses it.
DEVELOPMENT_SECRET_KEY = "dev-only-insecure-key-change-me-in-production"

TRUE = frozenset({"1", "true", "yes", "on"})
FALSE = frozenset({"0", "false", "no", "off"})

# A default computed from other settings (resolved in registry order): receives what is resolved so far.
Derived = Callable[[Mapping[str, Any]], Any]


class ConfigError(ValueError):
    """One or more settings have values that are not allowed; `problems` has one sentence each."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("Refusing to start, bad configuration: " + " ".join(problems)
                         + " See docs/configuration.md.")


@dataclass(frozen=True)
class Setting:
    name: str
    kind: str  # bool | int | float | str | choice | list | path
    default: Any  # a value, or a Derived callable (then `shown` says what it is in the docs)
    help: str
    group: str
    minimum: float | None = None  # ints and floats: the smallest value allowed
    choices: tuple[str, ...] = ()  # choice: the values allowed (compared case-insensitively)
    secret: bool = False  # never echo the value (messages say "<hidden>")
    node: bool = False  # also read by runner nodes (from their own environment)
    shown: str | None = None  # the default as documented, when it is computed

    def parse(self, raw: str) -> Any:
        """The typed value of a non-empty string, or ValueError saying what is allowed."""
        text = raw.strip()
        if self.kind == "bool":
            if text.lower() in TRUE:
                return True
            if text.lower() in FALSE:
                return False
            raise ValueError("expected a boolean: 1, true, yes, on or 0, false, no, off")
        if self.kind in ("int", "float"):
            try:
                number: float = int(text) if self.kind == "int" else float(text)
            except ValueError:
                raise ValueError(f"expected {'an integer' if self.kind == 'int' else 'a number'}"
                                 + self._bound()) from None
            if isinstance(number, float) and not math.isfinite(number):
                raise ValueError("expected a finite number" + self._bound())
            if self.minimum is not None and number < self.minimum:
                raise ValueError(f"expected {'an integer' if self.kind == 'int' else 'a number'}"
                                 + self._bound())
            return number
        if self.kind == "choice":
            if text.lower() not in self.choices:
                raise ValueError("expected one of " + ", ".join(self.choices))
            return text.lower()
        if self.kind == "list":
            return [item.strip() for item in text.split(",") if item.strip()]
        if self.kind == "path":
            return Path(text)
        return raw  # str: as given (a URL or a secret may carry meaningful spaces)

    def _bound(self) -> str:
        if self.minimum is None:
            return ""
        low = int(self.minimum) if float(self.minimum).is_integer() else self.minimum
        return f" >= {low}"

    def allowed(self) -> str:
        """What values are allowed, for the docs and for messages."""
        if self.kind == "bool":
            return "boolean"
        if self.kind == "choice":
            return " \\| ".join(f"`{c}`" for c in self.choices)
        if self.kind in ("int", "float"):
            return ("integer" if self.kind == "int" else "number") + self._bound()
        return {"list": "comma-separated list", "path": "path"}.get(self.kind, "string")

    def default_text(self) -> str:
        if self.shown is not None:
            return self.shown
        value = self.default
        if isinstance(value, bool):
            return "`true`" if value else "`false`"
        if isinstance(value, list):
            return f"`{','.join(value)}`" if value else "empty"
        if value == "" or value is None:
            return "empty"
        if isinstance(value, Path):
            return f"`{value.relative_to(BASE_DIR) if value.is_relative_to(BASE_DIR) else value}`"
        return f"`{value}`"


_REGISTRY: list[Setting] = []
_group = ""


def _add(name: str, kind: str, default: Any, help: str, **extra: Any) -> None:
    _REGISTRY.append(Setting(name=name, kind=kind, default=default, help=help, group=_group, **extra))


def _num(name: str, default: float, help: str, **extra: Any) -> None:
    """An int or float that must not be negative (sizes, counts, durations), typed by its default."""
    extra.setdefault("minimum", 0)
    _add(name, "int" if isinstance(default, int) else "float", default, help, **extra)


def _var(rel: str) -> Derived:
    return lambda got: got["ORS_VAR_DIR"] / rel


def _sandbox(name: str, help: str, **extra: Any) -> None:
    # The defaults stay in sandbox/config.py, which sandbox supervisors read without this module.
    default = SANDBOX_DEFAULTS[name]
    if isinstance(default, bool):
        _add(name, "bool", default, help, node=True, **extra)
    elif isinstance(default, str):
        _add(name, extra.pop("kind", "str"), default, help, node=True, **extra)
    else:
        _num(name, default, help, node=True, **extra)


def _channel(name: str, help: str) -> None:
    _num(name, CHANNEL_DEFAULTS[name], help, node=True)  # defaults: sandbox/framing.py


# --- Django and the deployment (docs/accounts.md) -----------------------------------------------------
_group = "Django and the deployment"
_add("DEBUG", "bool", False, "Django's debug mode. Off: with it on, Django records every SQL query "
     "(about a fifth of the hot path's database time).")
_add("SECRET_KEY", "str", DEVELOPMENT_SECRET_KEY,
     "Signs sessions and links. Setting it makes this a deployment: ALLOWED_HOSTS is then required, and "
     "the development key is refused.", secret=True, shown="the public development key")
_add("ALLOWED_HOSTS", "list", ["*"], "Host names this server answers for (any only on the embedded default).")
_add("CSRF_TRUSTED_ORIGINS", "list", [], "Origins trusted for form posts behind a proxy (https://host).")
_add("ORS_DEPLOYMENT", "choice", "", "`production` makes this a deployment even without SECRET_KEY set "
     "(which then refuses to start until it is).", choices=("production",))
_add("ORS_SECURE_COOKIES", "bool", False, "Behind TLS: cookies only over HTTPS, HSTS, and the proxy's "
     "X-Forwarded-Proto trusted. Makes this a deployment.")
_num("SECURE_HSTS_SECONDS", 3600, "HSTS max-age when ORS_SECURE_COOKIES is on.")
_add("ORS_DEV_LOGIN", "bool", lambda got: "SECRET_KEY" not in got["_environ"],
     "`make run` prints a one-time sign-in link and password for the built-in team's owner.",
     shown="on unless SECRET_KEY is set")
_add("ORS_LOG_LEVEL", "choice", "info", "Root log level.",
     choices=("debug", "info", "warning", "error", "critical"))
_add("ORS_LOG_FORMAT", "choice", "plain", "`json`: one JSON object a line, for log shippers.",
     choices=("plain", "json"))

# --- Storage and services -------------------------------------------------------------------------------
_group = "Storage and services"
_add("ORS_VAR_DIR", "path", BASE_DIR / "var", "Where the embedded default keeps its database, packages, "
     "uploads, environments and logs.")
_add("DATABASE_URL", "str", lambda got: f"sqlite:///{got['ORS_VAR_DIR'] / 'db.sqlite3'}",
     "Any URL dj-database-url understands (PostgreSQL in production).", secret=True,
     shown="`sqlite:///var/db.sqlite3`")
_num("ORS_DB_CONNECT_TIMEOUT_SECONDS", 5, "PostgreSQL: a database host that stops answering fails a "
     "request in this long (503 + Retry-After); DATABASE_URL's own ?connect_timeout= wins.")
_add("REDIS_URL", "str", "", "Shared limits across gateway processes; the celery executor's wake-ups, "
     "records and heartbeats. A runner node without it uses redis://127.0.0.1:6379/0.", secret=True,
     node=True)
_add("ORS_REDIS_PREFIX", "str", "ors", "Namespaces every Redis key (limit counters, runner records).",
     node=True)
_add("CELERY_BROKER_URL", "str", lambda got: got["REDIS_URL"] or "filesystem://localhost/",
     "Celery's broker (platform tasks, builds, replays, scheduled work; runner nodes do not use it). "
     "Without one, Celery's filesystem transport in ORS_BROKER_DIR, which `make run`'s worker reads.",
     secret=True, shown="REDIS_URL, else `filesystem://localhost/`")
_add("ORS_BROKER_DIR", "path", _var("broker"), "The embedded default's broker folder (filesystem transport).",
     shown="`var/broker`")
_add("CELERY_TASK_ALWAYS_EAGER", "bool", False, "Tests only: run platform tasks in the caller's process "
     "(tests/conftest.py). No mode of the platform.")
_add("CELERY_TASK_DEFAULT_QUEUE", "str", "celery", "The queue of platform tasks (ingest, builds, rollups).")
_add("ORS_PACKAGE_DIR", "path", _var("packages"), "Stored environment packages (shared with runner nodes).",
     shown="`var/packages`")
_add("ORS_ENVS_DIR", "path", BASE_DIR / "envs", "The bundled environments `publish_envs` publishes.")
_add("ORS_UPLOAD_DIR", "path", _var("uploads"), "Staged uploads.", shown="`var/uploads`")
_add("ORS_DATA_DIR", "path", _var("data"), "Data archives, stored once by content hash (shared with runner "
     "nodes; mounted read-only at /orwd_data). docs/data.md.", shown="`var/data`")

# --- Episodes: the ORS and OpenEnv faces -----------------------------------------------------------------
_group = "Episodes"
_add("ORS_EXECUTOR", "choice", "inline", "Where environment instances run: `inline` (sandbox workers "
     "supervised by the gateway) or `celery` (runner nodes).", choices=("inline", "celery"))
_num("ORS_IDLE_TIMEOUT_SECONDS", 900.0, "Idle sessions are torn down and answer 404 \"expired\" (ORS: 15 min).")
_num("ORS_REAPER_INTERVAL_SECONDS", 5.0, "How often the gateway looks for idle sessions.")
_num("ORS_SETUP_WAIT_SECONDS", 25.0, "How long a request waits for setup() before 503 starting.")
_num("ORS_SSE_PING_SECONDS", 5.0, "Comment pings while a tool runs (clients give up after 30 s of silence).")
_num("ORS_RESULT_LINGER_SECONDS", 120.0, "Finished results kept in memory for reconnects (then served from "
     "the audit log).")
_num("ORS_ACTIVITY_FLUSH_SECONDS", 30.0, "How often in-memory activity (pings) and key use are written.")
_num("ORS_MAX_BODY_BYTES", 10 * MiB, "ORS request bodies larger than this answer 413.")
_num("ORS_MAX_HEADER_BYTES", 16 * 1024, "Request headers larger than this are refused.")
_num("ORS_MAX_LIST_TASKS", 100_000, "The most tasks one `tasks` listing returns.")
_num("ORS_TOOL_THREADS", 64, "Threads for sync tools, per sandbox worker.", node=True)
_num("ORS_DEFAULT_TOOL_TIMEOUT_SECONDS", 600.0, "Per-tool timeout unless the manifest sets "
     "tool_timeout_seconds.")
_add("ORS_PG_ASYNC_WRITES", "bool", True, "PostgreSQL: hot writes on the event loop (psycopg async), "
     "not a DB thread.")
_add("ORS_DEFAULT_ENVIRONMENT", "str", "builtin/math", "`team/slug` for clients that name no environment.")
_add("ORS_BUILTIN_TEAM", "str", "builtin", "The team the bundled environments are published under.")
_add("ORS_ANONYMOUS_CATALOG", "bool", True, "May callers without a key read public catalogs?")
_add("ORS_ANONYMOUS_SESSIONS", "bool", False, "May callers without a key run sessions?")
_add("ORS_SECRETS_TRUSTED_TEAMS", "list", lambda got: [got["ORS_BUILTIN_TEAM"]],
     "Teams whose environments may receive any secret a caller sends; others receive only the secrets "
     "their manifest declares.", shown="ORS_BUILTIN_TEAM")
_num("ORS_AUTH_CACHE_SECONDS", 2.0, "A verified API key is trusted from the in-process cache this long; "
     "open OpenEnv sockets are re-checked as often.")
_num("ORS_OPENENV_MAX_SOCKETS_PER_KEY", 16384, "Open OpenEnv sockets per API key and gateway process "
     "(docs/authorization.md).")
_num("ORS_OPENENV_MAX_MCP_SESSIONS_PER_KEY", 16384, "MCP sessions per API key and gateway process.")
_num("ORS_CATALOG_CACHE_SECONDS", 2.0, "How long a gateway caches catalog reads.")
_num("ORS_LIVE_REFRESH_SECONDS", 10, "Pages with a run in progress refetch their figures this often.")

# --- The celery executor and runner nodes ------------------------------------------------------------
_group = "Celery executor and runner nodes"
_num("ORS_SESSION_CACHE_SECONDS", 1.0, "How long a gateway trusts its copy of another gateway's session row.")
_num("ORS_RUNNER_POLL_SECONDS", 1.0, "A waiting call re-reads the durable result this often (a lost "
     "wake-up costs at most this).")
_num("ORS_RUNNER_REPLY_TIMEOUT_SECONDS", 60.0, "How long a request waits for a runner's reply.")
_num("ORS_RUNNER_GRACE_SECONDS", 2.0, "Grace before a runner without a heartbeat counts as lost.")
_num("ORS_RUNNER_HEARTBEAT_SECONDS", 1.0, "How often a runner node writes its heartbeat.", node=True)
_num("ORS_RUNNER_HEARTBEAT_TTL", 5.0, "A heartbeat's lifetime in Redis.", node=True)
_num("ORS_STATE_TTL_SECONDS", 86400, "Session records kept in Redis.", node=True)
_num("ORS_RESULT_TTL_SECONDS", 3600, "Runners' results kept in Redis.", node=True)
_add("ORS_RUNNER_NAME", "str", "runner@%h", "A runner node's name (`--hostname` default; %h is the host).",
     node=True)
_add("ORS_RUNNER_TEAM", "str", "", "A node dedicated to one team (its slug) runs only that team's "
     "sessions; empty: the shared pool.", node=True)
_num("ORS_ORPHAN_AFTER_SECONDS", 30.0, "A running call its gateway has not recorded after this long is "
     "recorded by the sweeper.")
_num("ORS_REAP_EVERY_SECONDS", 5.0, "Beat: reaping idle sessions and lost runners.")
_num("ORS_SWEEP_EVERY_SECONDS", 30.0, "Beat: finishing orphaned calls.")

# --- The perimeter (docs/perimeter.md) -------------------------------------------------------------------
_group = "Perimeter"
_num("ORS_HEADER_TIMEOUT_SECONDS", 10.0, "A request's headers must arrive within this.")
_num("ORS_BODY_TIMEOUT_SECONDS", 30.0, "A request body that makes no progress this long is closed.")
_num("ORS_MAX_CONNECTIONS", 32768, "Client connections one process keeps (idle ones shed first).", minimum=1)
_num("ORS_FD_HEADROOM", 256, "Never closer than this to the open-files limit.")
_num("ORS_CONNECTION_RESERVE", 256, "Places kept for everyone else when WebSockets fill the cap (/health).")
_num("ORS_MAX_REQUEST_BYTES", 1 * MiB, "Django paths: body limit (upload routes have their own).")
_add("ORS_GC_FREEZE", "bool", True, "Freeze the server's start-up heap at lifespan startup, so full garbage "
     "collections skip it (docs/many-sockets.md).")
_num("ORS_GC_YOUNG_THRESHOLD", 50_000, "Objects in the youngest GC generation before a young collection "
     "(CPython's default is 700); 0 keeps CPython's value.")
_num("ORS_ROLLOUT_MAX_BODY_BYTES", 2 * MiB, "The Rollout API: a body as sent (docs/runs.md).")
_num("ORS_ROLLOUT_MAX_JSON_BYTES", 16 * MiB, "The Rollout API: a gzipped body once decompressed.")
_num("ORS_ROLLOUT_WRITER_THREADS", 8, "Threads writing Rollout API batches at once.", minimum=1)

# --- Sandbox workers (docs/sandbox.md) -------------------------------------------------------------------
_group = "Sandbox"
_sandbox("ORS_SANDBOX", "Where tenant code runs: `gvisor` (gVisor's application kernel, runsc), `bwrap` "
         "(bubblewrap's namespaces on the host's kernel), `auto` (gVisor when runsc can start a sandbox here, "
         "else bubblewrap, said at start with why) or `none` (no isolation, said at every start). An explicit "
         "runtime that cannot run here is refused at start.", kind="choice", choices=("auto", "gvisor", "bwrap", "none"))
_sandbox("ORS_GVISOR_RUNSC", "The runsc binary (gVisor).")
_sandbox("ORS_GVISOR_PLATFORM", "How gVisor intercepts system calls: `ptrace` (everywhere), `systrap` (newer "
         "gVisor, faster without a VM) or `kvm` (bare metal). docs/gvisor.md.", kind="choice",
         choices=("ptrace", "systrap", "kvm"))
_sandbox("ORS_SANDBOX_BWRAP", "The bubblewrap binary.")
_sandbox("ORS_SANDBOX_ALLOW_NETWORK", "May a manifest's `[sandbox] network = true` have outbound network?")
_sandbox("ORS_SANDBOX_SESSIONS_PER_WORKER", "More sessions of one (version, team) start another worker.",
         minimum=1)
_sandbox("ORS_SANDBOX_MAX_WORKERS_PER_KEY", "The most workers of one (version, team).", minimum=1)
_sandbox("ORS_SANDBOX_IDLE_SECONDS", "A worker without sessions this long is retired.")
_sandbox("ORS_SANDBOX_GRACE_SECONDS", "A call this far past its timeout gets its worker killed.")
_sandbox("ORS_SANDBOX_START_SECONDS", "A worker not ready after this long is killed.")
_sandbox("ORS_SANDBOX_MEMORY_MB", "A worker's memory when its manifest asks for none.", minimum=1)
_sandbox("ORS_SANDBOX_MAX_MEMORY_MB", "The most memory a manifest may ask for.", minimum=1)
_sandbox("ORS_SANDBOX_CPU_SECONDS", "A worker's CPU time when its manifest asks for none.", minimum=1)
_sandbox("ORS_SANDBOX_MAX_CPU_SECONDS", "The most CPU time a manifest may ask for.", minimum=1)
_sandbox("ORS_SANDBOX_PROCESSES", "A worker's processes when its manifest asks for none.", minimum=1)
_sandbox("ORS_SANDBOX_MAX_PROCESSES", "The most processes a manifest may ask for.", minimum=1)
_sandbox("ORS_SANDBOX_OPEN_FILES", "A worker's open files when its manifest asks for none.", minimum=1)
_sandbox("ORS_SANDBOX_MAX_OPEN_FILES", "The most open files a manifest may ask for.", minimum=1)
_sandbox("ORS_SANDBOX_TMP_MB", "A worker's /tmp when its manifest asks for none.", minimum=1)
_sandbox("ORS_SANDBOX_MAX_TMP_MB", "The most /tmp a manifest may ask for.", minimum=1)
_sandbox("ORS_SANDBOX_CPU_WEIGHT", "Each worker's CPU weight in its cgroup (cgroup v2 scale 1-10000).",
         minimum=1)
_sandbox("ORS_SANDBOX_TOTAL_CPU_WEIGHT", "All workers together against the platform's processes (100 "
         "each): under contention the platform runs first.", minimum=1)
_sandbox("ORS_SANDBOX_BUSY_CPU", "A worker using this share of one CPU is busy: its weight drops to "
         "ORS_SANDBOX_BUSY_CPU_WEIGHT until calm for a second (0: never).", minimum=0)
_sandbox("ORS_SANDBOX_BUSY_CPU_WEIGHT", "A busy worker's CPU weight (cgroup v2 scale 1-10000).", minimum=1)
_sandbox("ORS_SANDBOX_BUSY_CPU_IDLE", "A busy worker's cgroup is also idle (`cpu.idle`, Linux 5.15+): "
         "any calm worker waking on its CPU preempts it at once.")
# The tenant record (docs/tenant-record.md): a worker's channel to its supervisor.
_channel("ORS_MAX_TOOL_OUTPUT_BYTES", "An answer (tool output, prompt, task tools) larger than this ends "
         "its request with an error.")
_channel("ORS_MAX_FRAME_BYTES", "A frame larger than this breaks the protocol: its worker is killed.")
_channel("ORS_FRAME_DEADLINE_SECONDS", "A frame begun and not finished within this kills its worker.")
_channel("ORS_AUDIT_TRUNCATED_BYTES", "How much of an over-limit answer the audit log keeps.")
_num("ORS_PROMPT_RENDERS_PER_USER", 2, "The hub's \"Render prompt\": concurrent renders per signed-in user.")
_num("ORS_PROMPT_RENDERS_PER_TEAM", 4, "The hub's \"Render prompt\": concurrent renders per team.")

# --- Publishing and uploads (docs/uploads.md, docs/sandbox-inspection.md) ---------------------------------
_group = "Publishing and uploads"
_num("ORS_INSPECT_TIMEOUT_SECONDS", 120.0, "Wall time of a package's validation child.")
_num("ORS_INSPECT_MEMORY_BYTES", 1 * GiB, "Address space of a validation child (0: no limit).")
_num("ORS_INSPECT_FILE_BYTES", 1 * GiB, "Largest file a validation child may write (0: no limit).")
_num("ORS_INSPECT_RESULT_BYTES", 128 * MiB, "What a validation child may hand back over its pipe.")
_num("ORS_MAX_PACKAGE_BYTES", 64 * MiB, "Package uploads larger than this answer 413.")
_num("ORS_MAX_PACKAGE_UNPACKED_BYTES", 512 * MiB, "A package's size unpacked.")
_num("ORS_MAX_PACKAGE_FILES", 5000, "A package's entries (directories count).")
_num("ORS_MAX_COMPRESSION_RATIO", 200, "Unpacked size over packed size, against archive bombs.")
_num("ORS_MAX_PACKAGE_PATH_DEPTH", 32, "How deep a package's paths may go.")
_num("ORS_MAX_PACKAGE_PATH_BYTES", 1024, "How long a package's paths may be.")
_num("ORS_MAX_TASK_FILE_BYTES", 4 * GiB, "One uploaded task file.")
_num("ORS_MAX_TASK_BYTES", 8 * MiB, "One task (one JSONL line).")
_num("ORS_MAX_TASKS_PER_SPLIT", 1_000_000, "Tasks in one split (an ingest past it is refused whole, 413).")
_num("ORS_MAX_TASKS_PER_TEAM", 5_000_000, "Tasks in all of a team's splits.")
_num("ORS_TASK_CHECK_ROWS", 20, "Rows of a task upload (the first, others at random) run through the "
     "environment's setup() and get_prompt() in the sandbox before it is accepted; 0: none "
     "(docs/environment-lifecycle.md).")
_num("ORS_TASK_CHECK_TIMEOUT_SECONDS", 120.0, "How long the row check of one upload may take; rows not "
     "reached are an `incomplete` warning.")
_num("ORS_MAX_DATA_ARCHIVE_BYTES", 1 * GiB, "One data archive uploaded beside a package (docs/data.md).")
_num("ORS_MAX_DATA_UNPACKED_BYTES", 8 * GiB, "A data archive unpacked.")
_num("ORS_MAX_DATA_FILES", 100_000, "A data archive's entries.")
_num("ORS_STAGED_MAX_AGE_SECONDS", 6 * 3600.0, "Staged uploads older than this are removed (cleanup_staged).")
_num("ORS_CLEANUP_BATCH", 500, "Rows one cleanup pass handles.", minimum=1)
_num("ORS_CLEANUP_EVERY_SECONDS", 300.0, "Beat: cleaning staged uploads.")

# --- Requirements: a Python environment per version (docs/sdists.md) ------------------------------------
_group = "Builds"
_add("ORS_PYENV_DIR", "path", _var("pyenvs"), "Packages' built Python environments (shared with runner "
     "nodes).", shown="`var/pyenvs`")
_add("ORS_UV_CACHE_DIR", "path", lambda got: got["ORS_PYENV_DIR"] / ".uv-cache", "uv's cache; keep it "
     "inside ORS_PYENV_DIR (hard links do not cross mounts).", shown="`var/pyenvs/.uv-cache`")
_add("ORS_BUILD_LOG_DIR", "path", _var("builds"), "Build logs.", shown="`var/builds`")
_add("ORS_BUILD_INDEX_URL", "str", "https://pypi.org/simple", "Where builds install from.")
_add("ORS_BUILD_ALLOWED_HOSTS", "list", ["pypi.org", "files.pythonhosted.org"], "The only hosts the build "
     "sandbox's proxy lets through.")
_add("ORS_BUILD_EXTRA_INDEX_URLS", "list", [], "An operator's own indexes, searched first (http:// allowed).")
_add("ORS_OPENENV_VERSION", "str", "0.10.0", "The OpenEnv SDK an environment requiring openenv is built with.")
_num("ORS_BUILD_TIMEOUT_SECONDS", 900.0, "One build's wall time.")
_num("ORS_BUILD_MEMORY_MB", 4096, "One build's memory.", minimum=1)
_num("ORS_BUILD_DISK_MB", 4096, "One environment's files, and any one file.", minimum=1)
_add("ORS_BUILD_SDISTS", "bool", True, "Build requirements published only as source distributions.")
_num("ORS_BUILD_MAX_SDISTS", 8, "Source builds in one environment's build.")
_num("ORS_BUILD_MAX_SDIST_BYTES", 256 * MiB, "One downloaded sdist.")
_num("ORS_PYENV_GRACE_SECONDS", 3600.0, "An environment no version uses is removed after this long.")

# --- Container environments (docs/containers.md) ----------------------------------------------------------
_group = "Containers"
_add("ORS_CONTAINERS_DIR", "path", _var("containers"), "The platform's own Docker engine (data, socket, "
     "the local base images' cache).", shown="`var/containers`")
_add("ORS_DOCKER_HOST", "str", "", "An operator's Docker engine (with `ors-runsc` registered) instead of "
     "the platform's own.")
_add("ORS_DOCKER_CLI", "str", "", "The docker CLI (default: Debian's /usr/bin/docker, else the PATH's).")
_add("ORS_IMAGE_BUILD_ALLOWED_HOSTS", "list", ["registry.npmjs.org"], "HTTPS hosts an image build may "
     "reach besides ORS_BUILD_ALLOWED_HOSTS.")
_add("ORS_IMAGE_BUILD_HTTP_ORIGINS", "list", ["deb.debian.org:80", "security.debian.org:80"], "Plain-HTTP "
     "origins an image build may reach (Debian's mirrors, for apt-get).")
_num("ORS_IMAGE_INSPECT_TIMEOUT_SECONDS", 300.0, "Starting a built image and reading its server's tools.")
_num("ORS_IMAGE_BUILD_MEMORY_MB", 4096, "An image build's memory, all its RUN steps together (the platform's "
     "own engine; builds on one engine take turns).", minimum=1)
_num("ORS_IMAGE_BUILD_PROCESSES", 2048, "An image build's processes and threads (the platform's own engine).",
     minimum=1)
_num("ORS_IMAGE_BUILD_DISK_MB", 20480, "The disk an image build may take (its steps, layers and cache "
     "mounts); a build past it is stopped.", minimum=1)
_add("ORS_CONTAINER_ARCHIVES", "bool", lambda got: got["ORS_EXECUTOR"] == "celery", "Keep each built image "
     "as a `docker save` archive beside its package, for runner nodes' own engines (default: with the "
     "celery executor).", shown="on with `ORS_EXECUTOR=celery`")
_add("ORS_CONTAINER_LOCAL_BASES", "bool", True, "Build python:3.11-slim and openenv-base stand-ins with "
     "debootstrap (off: the engine pulls the real ones).")
_num("ORS_CONTAINER_MEMORY_MB", 2048, "A container's memory (its writable layer included) when its "
     "manifest asks for none.", minimum=1)
_num("ORS_CONTAINER_MAX_MEMORY_MB", 8192, "The most memory a manifest may ask for.", minimum=1)
_num("ORS_CONTAINER_PROCESSES", 512, "A container's processes.", minimum=1)
_num("ORS_CONTAINER_MAX_PROCESSES", 4096, "The most processes a manifest may ask for.", minimum=1)
_num("ORS_CONTAINER_CPUS", 2.0, "A container's CPUs.")
_num("ORS_CONTAINER_MAX_CPUS", 4.0, "The most CPUs a manifest may ask for.")
_num("ORS_CONTAINER_OPEN_FILES", 4096, "A container's open files.", minimum=1)
_add("ORS_CONTAINER_NETWORK_STACK", "choice", "gvisor", "What serves a container's loopback (it has no other "
     "network): `gvisor`, gVisor's own stack; `host`, the host kernel's, in the container's empty network "
     "namespace (faster; more of the host kernel in reach). Each is its own engine runtime (`ors-runsc`, "
     "`ors-runsc-hostnet`).",
     choices=("gvisor", "host"))
_num("ORS_CONTAINER_WARM_VERSIONS", 4, "Versions that keep a started container (a spare) for their next "
     "first session, on a gateway running its own sessions (0: none; each holds an idle container's memory).")
_num("ORS_CONTAINER_WARM_PER_TEAM", 2, "Of those, the most of one team's versions.")
_num("ORS_CONTAINER_WARM_IDLE_SECONDS", 3600.0, "A version neither built nor used for this long keeps no spare.")
_num("ORS_CONTAINER_WARM_CHECK_SECONDS", 5.0, "How often the gateway looks for versions to keep warm (a build "
     "that finished gets its spare within this).", minimum=0.1)

# --- Verified versions (docs/verified-versions.md) --------------------------------------------------------
_group = "Verified versions"
_num("ORS_REPLAY_DEFAULT_SAMPLE", 100, "Recorded episodes replayed against a new version (0: none).")
_num("ORS_REPLAY_MAX_SAMPLE", 5000, "The most an author may ask for.")
_num("ORS_REPLAY_SAMPLE_POOL", 10, "The sample is drawn from the most recent POOL x sample episodes.",
     minimum=1)
_num("ORS_REPLAY_CONCURRENCY", 32, "Episodes replayed at once.", minimum=1)
_num("ORS_REPLAY_PROGRESS_SECONDS", 0.5, "How often the progress bar's row is written.")
_num("ORS_REPLAY_STALE_SECONDS", 3600.0, "A replay still running after this long lost its process.")
_num("ORS_REPLAY_MAX_SOLUTIONS", 1000, "verify/solutions.jsonl: the most reference solutions.")
_num("ORS_REPLAY_MAX_SOLUTIONS_BYTES", 4 * MiB, "verify/solutions.jsonl: the most bytes.")

# --- Evaluations (docs/agents.md, docs/agent-egress.md) -------------------------------------------------
_group = "Evaluations"
_add("ORS_AGENT_KEY_SECRET", "str", lambda got: got["SECRET_KEY"], "Key material for agents' API keys and "
     "runs' secrets at rest; set it so rotating SECRET_KEY keeps them readable.", secret=True,
     shown="SECRET_KEY")
_add("ORS_EVAL_AGENT_ALLOWED_HOSTS", "list", [], "Where agents may live (host, host:port, IP, CIDR...); "
     "empty: any host whose every address is public.")
_num("ORS_EVAL_CONNECT_TIMEOUT_SECONDS", 10.0, "Connecting to an agent.")
_num("ORS_EVAL_META_TIMEOUT_SECONDS", 10.0, "The whole of GET /meta.")
_num("ORS_EVAL_MAX_META_BYTES", 1 * MiB, "What the platform reads of /meta.")
_num("ORS_EVAL_MAX_TURN_BYTES", 16 * MiB, "One turn's reply (JSON or stream).")
_num("ORS_EVAL_MAX_SSE_LINE_BYTES", 4 * MiB, "One line of a streamed reply.")
_num("ORS_EVAL_MAX_EVENT_BYTES", 4 * MiB, "One streamed event, all its lines.")
_num("ORS_EVAL_READ_TIMEOUT_SECONDS", 120.0, "Longest silence on an agent's response.")
_num("ORS_EVAL_TURN_TIMEOUT_SECONDS", 600.0, "Longest turn, whatever the agent sends meanwhile.")
_num("ORS_EVAL_CAPACITY_WAIT_SECONDS", 900.0, "How long an episode waits for an open-session slot.")
_num("ORS_EVAL_MAX_CONCURRENCY", 64, "The most concurrent episodes a run may ask for.", minimum=1)
_num("ORS_EVAL_MAX_EPISODES", 100_000, "The most episodes in one run.", minimum=1)
_num("ORS_EVAL_LEASE_SECONDS", 30.0, "A run's lease not renewed this long belongs to a dead worker.")
_num("ORS_EVAL_CANCEL_GRACE_SECONDS", 15.0, "A cancel waits this long for an agent's session id.")

# --- Analytics and flags (docs/flags.md) ----------------------------------------------------------------
_group = "Analytics and flags"
_add("ORS_ANALYTICS_PASS_REWARD", "float", 1.0, "An episode passes when its total reward reaches this.")
_num("ORS_FLAGS_EVERY_SECONDS", 300.0, "Beat: computing flags over recent episodes.")
_num("ORS_FLAGS_WINDOW_DAYS", 7.0, "Episodes this recent are looked at.")
_num("ORS_FLAGS_MAX_SESSIONS", 200_000, "The most sessions one pass reads.", minimum=1)
_num("ORS_FLAGS_MIN_EPISODES", 5, "Fewer episodes than this raise no flag.")
_num("ORS_FLAGS_FAST_PASS_RATIO", 0.34, "A pass this much faster than the median is \"fast\".")
_num("ORS_FLAGS_JUMP", 0.5, "A pass-rate jump this large between versions is flagged.")
_num("ORS_FLAGS_MIN_CALLS", 20, "Fewer calls than this raise no error-rate flag.")
_num("ORS_FLAGS_ERROR_RATE", 0.2, "A tool's error rate above this is flagged.")

# --- The audit log (docs/audit-log.md) -------------------------------------------------------------------
_group = "The audit log"
_num("ORS_AUDIT_PARTITIONS_AHEAD_DAYS", 7, "PostgreSQL: days of the audit log's daily partitions created ahead.",
     minimum=1)
_num("ORS_AUDIT_MAINTAIN_EVERY_SECONDS", 3600.0, "Beat: partitions ahead, retention and archiving.")
_num("ORS_AUDIT_RETENTION_DAYS", 90, "Days of tool calls kept in the database for a team without a policy of its "
     "own; older days are archived, then dropped.", minimum=1)
_add("ORS_AUDIT_ARCHIVE_DIR", "path", _var("archive"), "The archive store when ORS_AUDIT_ARCHIVE_URL is "
     "empty (a folder), and the cache of files read back from S3.", shown="`var/archive`")
_add("ORS_AUDIT_ARCHIVE_URL", "str", "", "`s3://bucket/prefix` to archive into an S3-compatible store (boto3's "
     "credentials), or a folder; empty: ORS_AUDIT_ARCHIVE_DIR.")
_add("ORS_AUDIT_ARCHIVE_S3_ENDPOINT", "str", "", "The S3 endpoint URL for a store other than AWS (MinIO, Ceph...).")
_num("ORS_AUDIT_LOCK_TIMEOUT_SECONDS", 2.0, "The longest a partition's detach or a team's delete waits for its "
     "lock (writers queue behind it meanwhile); then the next run tries again.")
_num("ORS_AUDIT_ARCHIVE_LAG_DAYS", 2, "Days past a team's retention after which a period not yet archived is "
     "logged as the archive falling behind.")

# --- Accounts (docs/accounts.md) -------------------------------------------------------------------------
_group = "Accounts"
_num("ORS_PASSWORD_MIN_LENGTH", 10, "Shortest password Django's validators accept.", minimum=1)
_num("ORS_LOGIN_FAILURE_LIMIT", 5, "Wrong passwords for one username from one address before a lockout.",
     minimum=1)
_num("ORS_LOGIN_COOLOFF_SECONDS", 900.0, "A lockout lasts this long without another try.")

REGISTRY: dict[str, Setting] = {s.name: s for s in _REGISTRY}
GROUPS: list[str] = list(dict.fromkeys(s.group for s in _REGISTRY))



def shown_value(setting: Setting, raw: str) -> str:
    return "<hidden>" if setting.secret else repr(raw)


def load(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Every registered setting's value from `environ` (os.environ by default): set ones parsed, unset
    or empty ones defaulted. Raises ConfigError naming every bad value at once."""
    environ = os.environ if environ is None else environ
    got: dict[str, Any] = {"_environ": environ}
    problems: list[str] = []
    for name, setting in REGISTRY.items():
        raw = environ.get(name)
        if raw is not None and raw.strip() != "":
            try:
                got[name] = setting.parse(raw)
                continue
            except ValueError as exc:
                problems.append(f"{name}={shown_value(setting, raw)} is not allowed: {exc}.")
        default = setting.default
        got[name] = default(got) if callable(default) else default
    if problems:
        raise ConfigError(problems)
    del got["_environ"]
    return got


def typos(environ: Mapping[str, str] | None = None) -> list[str]:
    """Set ORS_* variables that are not settings but look like one (`ORS_SANDBOXX`): a warning each,
    not an error, because clients and the compose file have ORS_* variables of their own
    (ORS_API_KEY, ORS_IMAGE, ORS_NGINX_*)."""
    environ = os.environ if environ is None else environ
    warnings = []
    for name in sorted(environ):
        if name.startswith("ORS_") and name not in REGISTRY:
            close = difflib.get_close_matches(name, REGISTRY, n=1, cutoff=0.9)
            if close:
                warnings.append(f"{name} is not a setting (ignored); did you mean {close[0]}?")
    return warnings


def load_or_exit(environ: Mapping[str, str] | None = None, *, program: str) -> dict[str, Any]:
    """load() for processes without Django (a runner node): a bad value prints its message and exits 2,
    before anything connects anywhere."""
    for warning in typos(environ):
        print(f"{program}: warning: {warning}", file=sys.stderr)
    try:
        return load(environ)
    except ConfigError as exc:
        print(f"{program}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def markdown() -> str:
    """docs/configuration.md: the table of every setting, grouped as registered."""
    out = [
        "# Configuration",
        "",
        "<!-- Generated by `python -m orsplatform.config --markdown > docs/configuration.md` from the",
        "     registry in orsplatform/config.py: edit the registry, not this page. -->",
        "",
        "Everything is read from environment variables with embedded defaults, so `make run` needs none.",
        "Every process checks every variable below that is set before it starts (the web app, "
        "`manage.py`, Celery workers, runner nodes): a value that is not allowed stops it with a "
        "message naming the variable, the value and what is allowed (`DEBUG=ture`, `ORS_SANDBOX=bwarp`, "
        "a negative size). An empty value means the default. A set `ORS_*` variable that is no setting but "
        "looks like one (`ORS_SANDBOXX`) is warned about at start-up.",
        "",
        "\"Node\" marks what runner nodes read from their own environment (they have no Django settings, "
        "no SECRET_KEY and no DATABASE_URL: [operators](operators.md#running-on-many-machines-the-celery-executor)). "
        "Secrets are never echoed in messages.",
        "",
        "Booleans are `1`, `true`, `yes`, `on` or `0`, `false`, `no`, `off` (any case).",
        "The compose file's own variables (images, ports, nginx) are in `docker/README.md`.",
    ]
    for group in GROUPS:
        out += ["", f"## {group}", "", "| variable | allowed | default | node | meaning |",
                "| --- | --- | --- | --- | --- |"]
        for s in REGISTRY.values():
            if s.group == group:
                help_text = s.help.replace("|", "\\|")
                out.append(f"| `{s.name}` | {s.allowed()} | {s.default_text()} | {'yes' if s.node else ''} "
                           f"| {help_text} |")
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    if argv == ["--markdown"]:
        sys.stdout.write(markdown())
        return 0
    if argv == ["--check"]:
        load_or_exit(program="orsplatform.config")
        print("configuration ok")
        return 0
    print("usage: python -m orsplatform.config --markdown | --check", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
