"""Side-by-side benchmark: the reference `ors.Server` vs the platform, same load, one invocation.

    cd /work/main && .venv/bin/python bench/compare.py --concurrency 16 --duration 20

Runs bench/loadgen.py's closed loop first against the reference server hosting envs/<env>/env.py,
then against the platform (started here under uvicorn or daphne, or an already running one with
--platform-url). Each server runs alone, as a subprocess on a free port, and is stopped before the
next one starts, so they never compete for CPU with each other.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

try:  # run as a script (bench/ on sys.path) or imported as bench.compare
    from loadgen import format_table, install_fast_loop, is_clean, run_load
except ImportError:  # pragma: no cover
    from bench.loadgen import format_table, install_fast_loop, is_clean, run_load

ROOT = Path(__file__).resolve().parents[1]
STOP_GRACE_S = 10.0
HEALTH_POLL_INTERVAL_S = 0.1
PG_ADMIN = ["-h", "127.0.0.1", "-U", "postgres"]
# The budgets of docs/design.md §7: throughput at least the reference's, tool-call p50 within 2 ms of it.
BUDGET_MIN_RATIO = 1.0
BUDGET_MAX_CALL_P50_DIFF_MS = 2.0


class SetupError(RuntimeError):
    """A server or management command failed; the message carries the relevant output."""


@dataclass
class LoadConfig:
    env: str
    concurrency: int
    duration: float
    warmup: float
    task_mode: str
    answer: str
    # Task fields the platform hides on every split of the environment (docs/hidden-tasks.md): the
    # filter on task reads and, with --task-mode spec, the rehydration of every /create are measured.
    hidden_fields: tuple[str, ...] = ()


def free_port() -> int:
    # Small race between closing and the server binding; acceptable for a local benchmark.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def log_tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@contextlib.contextmanager
def server_process(
    name: str, cmd: list[str], env: dict[str, str], base_url: str, log_path: Path, startup_timeout: float
) -> Iterator[subprocess.Popen[bytes]]:
    """Start `cmd`, wait until GET /health answers 200, and always stop it on exit."""
    with open(log_path, "wb") as log:
        # A file, not a pipe: nobody reads a pipe during the run, and a full one blocks the server.
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    try:
        wait_healthy(name, proc, base_url, log_path, startup_timeout)
        yield proc
    finally:
        stop_process(proc)


def tree_cpu_seconds(pid: int) -> float:
    """CPU (user + system) of a process and all its descendants (the platform's sandbox workers)."""
    ticks = os.sysconf("SC_CLK_TCK")
    stats: dict[int, tuple[int, float]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue
            stats[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / ticks)
    tree, frontier = {pid}, [pid]
    while frontier:
        parent = frontier.pop()
        for child, (ppid, _) in stats.items():
            if ppid == parent and child not in tree:
                tree.add(child)
                frontier.append(child)
    return sum(stats[p][1] for p in tree if p in stats)


def wait_healthy(
    name: str, proc: subprocess.Popen[bytes], base_url: str, log_path: Path, timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SetupError(
                f"{name} exited with {proc.returncode} before it was healthy:\n{log_tail(log_path)}"
            )
        try:
            with urllib.request.urlopen(f"{base_url}/health", timeout=1.0) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass  # not listening yet
        time.sleep(HEALTH_POLL_INTERVAL_S)
    raise SetupError(f"{name} not healthy after {timeout:g}s:\n{log_tail(log_path)}")


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=STOP_GRACE_S)


def run_command(cmd: list[str], env: dict[str, str], timeout: float) -> str:
    """Run a setup command to completion; return stdout, or raise SetupError with its output."""
    try:
        done = subprocess.run(
            cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
    except (subprocess.TimeoutExpired, OSError) as exc:
        raise SetupError(f"{' '.join(cmd)}: {exc}") from exc
    if done.returncode != 0:
        raise SetupError(
            f"{' '.join(cmd)} exited with {done.returncode}:\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
        )
    return done.stdout


def manage(args: list[str], env: dict[str, str], timeout: float = 300.0) -> str:
    return run_command([sys.executable, "manage.py", *args], env, timeout)


@contextlib.contextmanager
def postgres_database() -> Iterator[str]:
    """A fresh throwaway database, dropped afterwards even if the run fails."""
    name = f"orsbench_{secrets.token_hex(4)}"
    run_command(["createdb", *PG_ADMIN, name], dict(os.environ), timeout=60)
    try:
        yield f"postgres://postgres@127.0.0.1:5432/{name}"
    finally:
        # --force: a connection the stopped server left half-closed must not keep the database alive.
        with contextlib.suppress(SetupError):
            run_command(["dropdb", *PG_ADMIN, "--if-exists", "--force", name], dict(os.environ), timeout=60)


def measure(name: str, base_url: str, api_key: str | None, load: LoadConfig,
            server_pid: int | None = None) -> dict[str, Any]:
    """The load's result, with the server's CPU per measured episode (its whole process tree,
    sandbox workers included; read when the warm-up ends and when the load ends) and the load
    average."""
    print(
        f"-- {name}: {load.warmup:g}s warm-up + {load.duration:g}s at concurrency {load.concurrency} "
        f"against {base_url}",
        flush=True,
    )
    marks: list[float] = []
    timer = threading.Timer(load.warmup, lambda: marks.append(tree_cpu_seconds(server_pid))) if server_pid else None
    if timer is not None:
        timer.start()
    result = asyncio.run(
        run_load(
            base_url=base_url,
            env=load.env,
            concurrency=load.concurrency,
            duration=load.duration,
            warmup=load.warmup,
            api_key=api_key,
            task_mode=load.task_mode,
            answer=load.answer,
        )
    )
    if timer is not None:
        timer.cancel()
        if marks:
            cpu = tree_cpu_seconds(server_pid) - marks[0]
            result["server_cpu_ms_per_episode"] = cpu * 1000 / max(result["episodes"], 1)
    result["loadavg"] = os.getloadavg()
    print(f"server CPU per episode {result.get('server_cpu_ms_per_episode', float('nan')):.2f} ms  "
          f"load average {' '.join(f'{x:.2f}' for x in result['loadavg'])}", flush=True)
    return result


def bench_reference(script: Path, load: LoadConfig, workdir: Path, startup_timeout: float) -> dict[str, Any]:
    if not script.is_file():
        raise SetupError(f"reference environment script not found: {script}")
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    # Same log level as the platform, so neither pays for per-request INFO logging.
    env = {**os.environ, "PORT": str(port), "ORS_LOG_LEVEL": "WARNING"}
    with server_process(
        "reference server",
        [sys.executable, str(script)],
        env,
        base_url,
        workdir / "reference.log",
        startup_timeout,
    ) as proc:
        return measure("reference", base_url, None, load, proc.pid)


def platform_env(database_url: str) -> dict[str, str]:
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "orsplatform.settings",
        "ORS_LOG_LEVEL": "WARNING",
        "DATABASE_URL": database_url,
    }


def platform_command(server: str, port: int) -> list[str]:
    app = "orsplatform.asgi:application"
    if server == "daphne":
        args = f"-m daphne -b 127.0.0.1 -p {port} {app}"
    else:
        args = (
            f"-m uvicorn {app} --host 127.0.0.1 --port {port} --no-access-log --log-level warning"
            # As `make run` starts it: the perimeter's protocol (header deadline, connection cap) is
            # httptools' with its limits on, so the ratios are measured with them.
            " --loop uvloop --http orsplatform.perimeter.connections:PerimeterHttpToolsProtocol"
            " --ws-per-message-deflate false"
        )
    return [sys.executable, *args.split()]


HIDE_FIELDS = """
from orsplatform.catalog.models import Split
from orsplatform.catalog.protection import split_protection_set
for split in Split.objects.filter(environment__team__slug="builtin", environment__slug={env!r}):
    split_protection_set(split=split, hidden_fields={fields!r})
"""


def prepare_platform(env: dict[str, str], load: LoadConfig | None = None) -> str:
    """Migrate, publish envs/*, mint an API key; returns the key (last stdout line of create_api_key)."""
    manage(["migrate", "--noinput"], env)
    manage(["publish_envs"], env)
    if load is not None and load.hidden_fields:
        manage(["shell", "-c", HIDE_FIELDS.format(env=load.env, fields=list(load.hidden_fields))], env)
    # A key name is unique among a team's live keys, and a reused database may already hold "bench".
    lines = manage(["create_api_key", "builtin", f"bench-{secrets.token_hex(3)}"], env, timeout=60).strip().splitlines()
    if not lines:
        raise SetupError("create_api_key printed nothing")
    return lines[-1].strip()


def bench_platform(
    server: str, database_url: str, load: LoadConfig, workdir: Path, startup_timeout: float
) -> dict[str, Any]:
    env = platform_env(database_url)
    api_key = prepare_platform(env, load)
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    with server_process(
        f"platform ({server})",
        platform_command(server, port),
        env,
        base_url,
        workdir / f"platform-{server}.log",
        startup_timeout,
    ) as proc:
        return measure(f"platform ({server})", base_url, api_key, load, proc.pid)


def run_platform(args: argparse.Namespace, load: LoadConfig, workdir: Path) -> dict[str, Any]:
    if args.platform_url:
        return measure("platform (external)", args.platform_url.rstrip("/"), args.api_key, load)
    if args.postgres:
        with postgres_database() as database_url:
            return bench_platform(args.server, database_url, load, workdir, args.startup_timeout)
    database_url = os.environ.get("DATABASE_URL") or f"sqlite:///{workdir / 'bench.sqlite3'}"
    return bench_platform(args.server, database_url, load, workdir, args.startup_timeout)


def ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else float("nan")


def compare(reference: dict[str, Any], platform: dict[str, Any]) -> dict[str, Any]:
    ref_eps, plat_eps = reference["episodes_per_s"], platform["episodes_per_s"]
    ref_ep, plat_ep = reference["endpoints"], platform["endpoints"]
    call_diff = plat_ep["call"]["p50_ms"] - ref_ep["call"]["p50_ms"]
    eps_ratio = ratio(plat_eps, ref_eps)
    return {
        "episodes_per_s_ratio": eps_ratio,
        "call_p50_diff_ms": call_diff,
        "p50_ratio": {name: ratio(plat_ep[name]["p50_ms"], ref_ep[name]["p50_ms"]) for name in ref_ep},
        "server_cpu_ms_per_episode": [reference.get("server_cpu_ms_per_episode"),
                                      platform.get("server_cpu_ms_per_episode")],
        "budget_ok": (
            eps_ratio >= BUDGET_MIN_RATIO
            and call_diff <= BUDGET_MAX_CALL_P50_DIFF_MS
            and is_clean(reference)
            and is_clean(platform)
        ),
    }


def format_comparison(result: dict[str, Any]) -> str:
    lines = [
        "== platform vs reference ==",
        f"episodes/s ratio (platform / reference): {result['episodes_per_s_ratio']:.3f}",
        f"/call p50 difference (platform - reference): {result['call_p50_diff_ms']:+.2f} ms",
        "p50 ratio (platform / reference): "
        + "  ".join(f"{name} {value:.2f}" for name, value in result["p50_ratio"].items()),
        "server CPU per episode (reference / platform): "
        + " / ".join(f"{v:.2f} ms" if v is not None else "n/a" for v in result["server_cpu_ms_per_episode"]),
        f"budget (ratio >= {BUDGET_MIN_RATIO:g}, /call p50 diff <= {BUDGET_MAX_CALL_P50_DIFF_MS:g} ms, "
        f"no errors): {'PASS' if result['budget_ok'] else 'FAIL'}",
    ]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Benchmark the platform against the reference ORS server.")
    parser.add_argument("--env", default="math", help="environment (envs/<env>/env.py for the reference)")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--duration", type=float, default=20.0, help="measured seconds per server")
    parser.add_argument("--warmup", type=float, default=3.0, help="unmeasured seconds per server")
    parser.add_argument("--task-mode", choices=("index", "spec"), default="index")
    parser.add_argument("--answer", choices=("correct", "wrong"), default="correct")
    parser.add_argument("--hide-fields", default="", help="comma-separated task fields the platform hides "
                        "(e.g. answer; then --answer wrong, since clients no longer read the answer)")
    parser.add_argument(
        "--server", choices=("uvicorn", "daphne"), default="uvicorn", help="ASGI server for the platform"
    )
    parser.add_argument(
        "--platform-url",
        default=None,
        help="benchmark this running platform instead of starting one (use with --api-key)",
    )
    parser.add_argument("--api-key", default=None, help="API key for --platform-url")
    parser.add_argument("--sandbox", default=None, help="the platform's sandbox runtimes to measure one after "
                        "the other, e.g. bwrap,gvisor (ORS_SANDBOX; default: the environment's setting)")
    parser.add_argument(
        "--postgres",
        action="store_true",
        help="run the platform on a fresh Postgres database (created and dropped here)",
    )
    parser.add_argument(
        "--reference-script",
        type=Path,
        default=None,
        help="reference server script (default: envs/<env>/env.py)",
    )
    parser.add_argument("--startup-timeout", type=float, default=60.0, help="seconds to wait for /health")
    parser.add_argument("--json-out", type=Path, default=None, help="write all results as JSON here")
    parser.add_argument(
        "--keep-dir",
        type=Path,
        default=None,
        help="keep server logs (and the SQLite file) here instead of a temp dir",
    )
    return parser


@contextlib.contextmanager
def work_directory(keep: Path | None) -> Iterator[Path]:
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        yield keep.resolve()
        return
    with tempfile.TemporaryDirectory(prefix="orsbench-") as tmp:
        yield Path(tmp)


def run_side(label: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any] | None:
    """Run one side; a setup failure is reported and the other side still runs."""
    try:
        result = fn()
    except Exception as exc:  # noqa: BLE001 - any failure of one side must not lose the other's numbers
        print(f"!! {label} failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return None
    print(format_table(result, title=label), flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.platform_url and args.postgres:
        print(
            "--postgres starts its own platform; it cannot be combined with --platform-url", file=sys.stderr
        )
        return 2
    install_fast_loop()
    load = LoadConfig(
        env=args.env,
        concurrency=args.concurrency,
        duration=args.duration,
        warmup=args.warmup,
        task_mode=args.task_mode,
        answer=args.answer,
        hidden_fields=tuple(f.strip() for f in args.hide_fields.split(",") if f.strip()),
    )
    script = args.reference_script or ROOT / "envs" / args.env / "env.py"

    runtimes = [r.strip() for r in args.sandbox.split(",") if r.strip()] if args.sandbox else [None]
    platforms: dict[str, dict[str, Any] | None] = {}
    with work_directory(args.keep_dir) as workdir:
        reference = run_side(
            "reference (ors.Server)", lambda: bench_reference(script, load, workdir, args.startup_timeout)
        )
        for runtime in runtimes:
            if runtime:  # the platform's server reads ORS_SANDBOX (bwrap, gvisor, ...) at start
                os.environ["ORS_SANDBOX"] = runtime
            label = f"platform ({'external' if args.platform_url else args.server}{', ' + runtime if runtime else ''})"
            platforms[runtime or "default"] = run_side(label, lambda: run_platform(args, load, workdir))

    comparisons = {}
    for name, platform in platforms.items():
        comparison = compare(reference, platform) if reference and platform else None
        comparisons[name] = comparison
        if comparison:
            print(f"-- sandbox: {name}" if args.sandbox else "", flush=True)
            print(format_comparison(comparison))
    if args.json_out:
        report = {
            "config": vars(load),
            "reference": reference,
            "platform": platforms if args.sandbox else platforms["default"],
            "comparison": comparisons if args.sandbox else comparisons["default"],
        }
        args.json_out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    ok = reference is not None and is_clean(reference) and all(p is not None and is_clean(p) for p in platforms.values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
