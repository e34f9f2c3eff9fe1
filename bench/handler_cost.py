"""What a request handler costs: GET /health through four ASGI stacks, under uvicorn and daphne.

    cd /work/main && .venv/bin/python bench/handler_cost.py --duration 5

The platform serves the ORS protocol through its own lean ASGI app instead of Django views because
Django's request handler alone costs more than the whole reference FastAPI server. This script
documents that with numbers from one run: every application of bench/handler_apps.py answers the same
trivial `{"status": "ok"}`, so what differs between rows is the per-request cost of the stack
(server, router, framework, middleware) and nothing else.

For each server × application: start the server as a subprocess on a free port, poll /health until it
answers (with a deadline), run a closed loop of GET /health from one aiohttp session at a fixed
concurrency (warm-up, then the measured window), and stop the server before the next one starts, so
no two servers ever compete for the CPUs. Printed: req/s, p50/p99 latency, the ratio of req/s to the
reference app on uvicorn, the server's CPU time per request, the client's CPU use, and the CPU used
by anything else on the machine during the window.

Reading the numbers: client and server share the machine's CPUs, so req/s is capped by whichever of
the two saturates first (a client near 100 % means the client was the limit). Server CPU µs per
request does not depend on the client's speed and is the most direct measure of handler cost. A row
with a high "other CPU" ran while something else was busy on the machine; rerun it before quoting it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

try:  # run as a script (bench/ on sys.path) or imported as bench.handler_cost
    from compare import SetupError, free_port, manage, stop_process, wait_healthy, work_directory
    from handler_apps import APP_NAMES
    from loadgen import install_fast_loop, percentile
except ImportError:  # pragma: no cover
    from bench.compare import SetupError, free_port, manage, stop_process, wait_healthy, work_directory
    from bench.handler_apps import APP_NAMES
    from bench.loadgen import install_fast_loop, percentile

ROOT = Path(__file__).resolve().parents[1]
SERVERS: tuple[str, ...] = ("uvicorn", "daphne")
BASELINE = ("reference", "uvicorn")  # every row's req/s is divided by this row's
EXPECTED_BODY: dict[str, str] = {"status": "ok"}
REQUEST_TIMEOUT_S = 10.0
MAX_ERROR_SAMPLES = 3
# Importing twisted (daphne) makes zope.interface break ors.Environment.list_tools() with
# AttributeError: __provides__, so ors.Server cannot even be built inside a daphne process.
TWISTED_MARKER = "__provides__"
TWISTED_NOTE = "n/a (twisted breaks ors-sdk)"
try:
    CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
except (AttributeError, ValueError, OSError):  # pragma: no cover - not Linux
    CLOCK_TICKS = 0


@dataclass
class Row:
    app: str
    server: str
    status: str = "ok"  # "ok", TWISTED_NOTE, or "failed: ..."
    requests: int = 0
    req_per_s: float = math.nan
    p50_ms: float = math.nan
    p99_ms: float = math.nan
    ratio: float = math.nan  # req/s ÷ req/s of BASELINE
    server_cpu_us_per_req: float = math.nan
    client_cpu_pct: float = math.nan
    # Busy CPU of everything but this client and the server, in % of one CPU: other work on a shared
    # machine steals CPU from the run, so a row with a high value here is not comparable to the rest.
    other_cpu_pct: float = math.nan
    errors: int = 0
    errors_by: dict[str, int] = field(default_factory=dict)
    error_samples: list[str] = field(default_factory=list)


# --- servers -------------------------------------------------------------------------------------


def server_command(server: str, app: str, port: int) -> list[str]:
    target = f"bench.handler_apps:{app}"
    if server == "uvicorn":
        args = (
            f"-m uvicorn {target} --host 127.0.0.1 --port {port}"
            " --loop uvloop --http httptools --no-access-log --log-level warning"
        )
    else:
        # -v 0: daphne writes an access-log line per request to stdout at its default verbosity;
        # verbosity 0 turns that off and logs warnings only, the same as the uvicorn flags above.
        args = f"-m daphne -b 127.0.0.1 -p {port} -v 0 {target}"
    return [sys.executable, *args.split()]


def server_env(database_url: str) -> dict[str, str]:
    pythonpath = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {
        **os.environ,
        "PYTHONPATH": pythonpath,
        "DJANGO_SETTINGS_MODULE": "orsplatform.settings",
        # Read by both the platform's settings and the ORS SDK: no per-request INFO logging anywhere.
        "ORS_LOG_LEVEL": "WARNING",
        "DATABASE_URL": database_url,
    }


@contextlib.contextmanager
def running_server(
    name: str, cmd: list[str], env: dict[str, str], base_url: str, log_path: Path, startup_timeout: float
) -> Iterator[subprocess.Popen[bytes]]:
    """Start `cmd`, wait until GET /health answers 200, yield the process; always stop it on exit."""
    with open(log_path, "wb") as log:
        # A file, not a pipe: nobody reads a pipe during the run, and a full one blocks the server.
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    try:
        wait_healthy(name, proc, base_url, log_path, startup_timeout)
        yield proc
    finally:
        stop_process(proc)  # SIGTERM, then SIGKILL after a grace period


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU of a process, all threads included (Linux /proc); NaN when unavailable."""
    if not CLOCK_TICKS:
        return math.nan
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return math.nan
    # Fields after the parenthesised command name (which may itself contain spaces);
    # utime and stime are fields 14 and 15 of the whole line, i.e. 11 and 12 after the name.
    fields = stat[stat.rindex(b")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def machine_busy_seconds() -> float:
    """CPU seconds spent busy by the whole machine, summed over CPUs (Linux /proc/stat); NaN elsewhere."""
    if not CLOCK_TICKS:
        return math.nan
    try:
        with open("/proc/stat", "rb") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return math.nan
    # user nice system idle iowait irq softirq steal [guest guest_nice, already inside user/nice]
    return (sum(fields[:8]) - fields[3] - fields[4]) / CLOCK_TICKS


# --- load ----------------------------------------------------------------------------------------


def is_expected(body: bytes) -> bool:
    # Parsed, not compared as bytes: Django's encoder writes '{"status": "ok"}' with a space.
    try:
        return orjson.loads(body) == EXPECTED_BODY
    except orjson.JSONDecodeError:
        return False


@dataclass
class LoadResult:
    latencies: list[float]
    errors: Counter[str]
    error_samples: list[str]
    client_cpu_s: float
    server_cpu_s: float
    machine_busy_s: float


async def hammer(url: str, server_pid: int, concurrency: int, warmup: float, duration: float) -> LoadResult:
    """Closed loop: `concurrency` workers, each sending GET `url` as soon as its last answer arrived.

    A request counts (throughput and latency) when it both starts and ends inside the measured window;
    CPU of this process and of the server is sampled at the window's edges.
    """
    measure_start = time.perf_counter() + warmup
    deadline = measure_start + duration
    latencies: list[float] = []
    errors: Counter[str] = Counter()
    samples: list[str] = []

    def error(kind: str, message: str, started: float) -> None:
        if started >= measure_start:
            errors[kind] += 1
            if len(samples) < MAX_ERROR_SAMPLES:
                samples.append(f"[{kind}] {message}"[:300])

    async def worker(http: aiohttp.ClientSession) -> None:
        while (started := time.perf_counter()) < deadline:
            try:
                async with http.get(url) as resp:
                    body = await resp.read()
                    status = resp.status
            except (aiohttp.ClientError, TimeoutError) as exc:
                error(type(exc).__name__, str(exc), started)
                continue
            ended = time.perf_counter()
            if status != 200:
                error(str(status), body[:200].decode(errors="replace"), started)
            elif not is_expected(body):
                error("body", body[:200].decode(errors="replace"), started)
            elif started >= measure_start and ended <= deadline:
                latencies.append(ended - started)

    async def cpu_at(moment: float) -> tuple[float, float, float]:
        await asyncio.sleep(max(0.0, moment - time.perf_counter()))
        return time.process_time(), process_cpu_seconds(server_pid), machine_busy_seconds()

    # Keep-alive pool sized to the concurrency, so each worker keeps one connection for the whole run.
    connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=concurrency)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        workers = [asyncio.create_task(worker(http)) for _ in range(concurrency)]
        try:
            client_0, server_0, machine_0 = await cpu_at(measure_start)
            client_1, server_1, machine_1 = await cpu_at(deadline)
            # Workers finish the request they are in (bounded by the request timeout) and stop.
            await asyncio.gather(*workers)
        finally:
            for task in workers:
                task.cancel()
    return LoadResult(
        latencies, errors, samples, client_1 - client_0, server_1 - server_0, machine_1 - machine_0
    )


# --- one row, all rows ---------------------------------------------------------------------------


def measure_one(app: str, server: str, args: argparse.Namespace, env: dict[str, str], workdir: Path) -> Row:
    row = Row(app=app, server=server)
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    log_path = workdir / f"{app}-{server}.log"
    print(f"-- {app} on {server} ({args.warmup:g}s warm-up + {args.duration:g}s)", flush=True)
    try:
        with running_server(
            f"{app} ({server})",
            server_command(server, app, port),
            env,
            base_url,
            log_path,
            args.startup_timeout,
        ) as proc:
            load = asyncio.run(
                hammer(f"{base_url}/health", proc.pid, args.concurrency, args.warmup, args.duration)
            )
    except SetupError as exc:
        log_text = log_path.read_text(errors="replace") if log_path.exists() else ""
        if app == "reference" and server == "daphne" and TWISTED_MARKER in log_text:
            row.status = TWISTED_NOTE
        else:
            row.status = "failed: server did not start"
            print(f"!! {exc}", file=sys.stderr, flush=True)
        return row

    ordered = sorted(load.latencies)
    row.requests = len(ordered)
    row.req_per_s = len(ordered) / args.duration
    row.p50_ms = percentile(ordered, 50) * 1000
    row.p99_ms = percentile(ordered, 99) * 1000
    row.server_cpu_us_per_req = load.server_cpu_s / len(ordered) * 1e6 if ordered else math.nan
    row.client_cpu_pct = 100 * load.client_cpu_s / args.duration
    row.other_cpu_pct = max(
        0.0, 100 * (load.machine_busy_s - load.client_cpu_s - load.server_cpu_s) / args.duration
    )
    row.errors = sum(load.errors.values())
    row.errors_by = dict(load.errors)
    row.error_samples = load.error_samples
    if row.errors:
        print(
            f"!! {app} on {server}: {row.errors} errors, e.g. {load.error_samples}",
            file=sys.stderr,
            flush=True,
        )
    return row


def run_all(args: argparse.Namespace, workdir: Path) -> list[Row]:
    database_url = f"sqlite:///{workdir / 'x.sqlite3'}"  # workdir is absolute: sqlite:////tmp/...
    env = server_env(database_url)
    # The platform's app needs a migrated database to start; the other apps never touch it.
    manage(["migrate", "--noinput"], env)
    rows = [measure_one(app, server, args, env, workdir) for server in args.servers for app in args.apps]
    baseline = next((r for r in rows if (r.app, r.server) == BASELINE and r.status == "ok"), None)
    for row in rows:
        if baseline is not None and baseline.req_per_s > 0:
            row.ratio = row.req_per_s / baseline.req_per_s
    return rows


def format_table(rows: list[Row], args: argparse.Namespace) -> str:
    header = (
        "app",
        "server",
        "req/s",
        "p50 ms",
        "p99 ms",
        "vs ref/uvicorn",
        "server CPU µs/req",
        "client CPU",
        "other CPU",
    )
    cells: list[tuple[str, ...]] = [
        (
            r.app,
            r.server,
            f"{r.req_per_s:,.0f}",
            f"{r.p50_ms:.2f}",
            f"{r.p99_ms:.2f}",
            f"{r.ratio:.2f}x",
            f"{r.server_cpu_us_per_req:.0f}",
            f"{r.client_cpu_pct:.0f}%",
            f"{r.other_cpu_pct:.0f}%",
        )
        if r.status == "ok"
        # A row without numbers shows its status across the numeric columns.
        else (r.app, r.server, r.status)
        for r in rows
    ]
    widths = [len(h) for h in header]
    for line in cells:
        if len(line) == len(header):
            widths = [max(w, len(c)) for w, c in zip(widths, line, strict=True)]
    # Text columns left-aligned, numbers right-aligned.
    lines = [
        f"GET /health, closed loop, concurrency {args.concurrency}, {args.warmup:g}s warm-up + "
        f"{args.duration:g}s measured, {os.cpu_count()} CPUs",
        "  ".join(
            h.ljust(w) if i < 2 else h.rjust(w) for i, (h, w) in enumerate(zip(header, widths, strict=True))
        ),
    ]
    for line in cells:
        # strict=False: a status row has fewer cells than there are columns.
        cols = enumerate(zip(line, widths, strict=False))
        lines.append("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in cols))
    errors = sum(r.errors for r in rows)
    lines.append(
        f"errors: {errors}" + ("" if errors else ' (every measured answer was 200 {"status": "ok"})')
    )
    return "\n".join(lines)


def json_safe(value: Any) -> Any:
    """NaN (a row without numbers) becomes null: json.dumps would write NaN, which is not JSON."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_safe(v) for v in value]
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Per-request cost of ASGI stacks on GET /health.")
    parser.add_argument("--duration", type=float, default=5.0, help="measured seconds per run")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds of load before that")
    parser.add_argument("--concurrency", type=int, default=16, help="closed-loop workers")
    parser.add_argument("--apps", nargs="+", choices=APP_NAMES, default=list(APP_NAMES))
    parser.add_argument("--servers", nargs="+", choices=SERVERS, default=list(SERVERS))
    parser.add_argument("--startup-timeout", type=float, default=60.0, help="seconds to wait for /health")
    parser.add_argument("--json-out", type=Path, default=None, help="also write the rows as JSON here")
    parser.add_argument(
        "--keep-dir", type=Path, default=None, help="keep server logs and the SQLite file here"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.duration <= 0 or args.warmup < 0 or args.concurrency < 1:
        print("--duration must be > 0, --warmup >= 0 and --concurrency >= 1", file=sys.stderr)
        return 2
    install_fast_loop()  # the client shares the CPUs with the server; uvloop keeps its share small
    try:
        with work_directory(args.keep_dir) as workdir:
            rows = run_all(args, workdir)
    except SetupError as exc:  # migrate failed: nothing could be measured
        print(f"!! setup failed: {exc}", file=sys.stderr)
        return 2
    print(format_table(rows, args))
    if args.json_out:
        report = {
            "config": {k: v for k, v in vars(args).items() if k not in ("json_out", "keep_dir")},
            "cpus": os.cpu_count(),
            "baseline": {"app": BASELINE[0], "server": BASELINE[1]},
            "rows": [asdict(r) for r in rows],
        }
        args.json_out.write_text(json.dumps(json_safe(report), indent=2, default=str) + "\n")
    # A documented n/a is an expected outcome; a failed start or any error is not.
    ok = all(r.status in ("ok", TWISTED_NOTE) and not r.errors for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
