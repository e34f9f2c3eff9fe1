"""The OpenEnv face side by side with OpenEnv's own server, and a hold test of many open sockets.

    .venv/bin/python bench/openenv_compare.py --concurrency 16 64 --duration 20
    .venv/bin/python bench/openenv_compare.py --hold 2000 --step-every 5 --duration 60

Compare mode, in one invocation and for each concurrency: (1) the reference, envs/<env> wrapped by
upstream's ORS importer (``openenv import --type ors``, i.e. its template) and served by OpenEnv's
``create_app`` on uvicorn, then (2) the platform (API keys on, every tool call in the audit log)
serving the same environment at ``/openenv/builtin/<env>/``. Each side runs alone. Both are driven by
unmodified ``GenericEnvClient``s, the client TRL wraps: every worker keeps one socket and plays
episodes back to back, an episode being ``reset(split, index)`` then one ``call_tool`` step with the
task's answer (reward 1.0 expected), as a trainer reuses one environment client per rollout slot.

``--sdk-env``: the same comparison on an environment written against OpenEnv's own SDK (the
``MCPEnvironment`` ``tally`` of tests/catalog/openenv_packages.py, laid out as OpenEnv's examples
are): the reference serves the package's own ``server/app.py`` (its ``create_app``) on uvicorn, the
platform hosts the same package published unchanged (``publish_env``, as ``builtin/tally``; without
its pyproject.toml, so it runs on the platform's runtime, where the test extra installed openenv: the
build is exercised by the tests, not timed here). An episode is ``reset(target=k)`` then one
``call_tool("add", amount=k)``, which ends it with reward 1.0.

Hold mode: ``--hold N`` sockets are opened against the platform and kept open for the duration, each
calling a tool every ``--step-every`` seconds (jittered); prints the success rate and step latency.
Its sockets speak through ``bench/lean_ws.py``, the frames GenericEnvClient sends (pings every 20 s
included) at about a fifth of its CPU, so the load generator leaves the shared box to the server;
``--client openenv`` holds them with the unmodified client instead.
The importer's generated server limits itself to one session and marks the environment as not
concurrency-safe; the reference runs it with that flag set and ``max_concurrent_envs`` raised, the
only change, so it can serve the same concurrency.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:  # run as a script (bench/ on sys.path) or imported as bench.openenv_compare
    from compare import (
        ROOT,
        SetupError,
        free_port,
        manage,
        platform_command,
        platform_env,
        postgres_database,
        prepare_platform,
        run_command,
        stop_process,
        tree_cpu_seconds,
        wait_healthy,
    )
except ImportError:  # pragma: no cover
    from bench.compare import (
        ROOT,
        SetupError,
        free_port,
        manage,
        platform_command,
        platform_env,
        postgres_database,
        prepare_platform,
        run_command,
        stop_process,
        tree_cpu_seconds,
        wait_healthy,
    )

# Imported once up front: importing openenv (gradio, fastmcp) takes seconds, which must not fall
# inside a measured window.
from openenv.core.generic_client import GenericEnvClient  # noqa: E402

try:
    from lean_ws import LeanSocket
    from loadgen import collector_off
except ImportError:  # pragma: no cover
    from bench.lean_ws import LeanSocket
    from bench.loadgen import collector_off


class _HeldClient:
    """The hold's client: ``bench/lean_ws.py`` (the same frames as GenericEnvClient at a fraction of its CPU,
    so the load generator leaves the 2-core box to the server) or, with ``--client openenv``, the unmodified one."""

    def __init__(self, url: str, headers: dict[str, str], kind: str) -> None:
        self.url, self.headers, self.kind = url, headers, kind
        self.sock: LeanSocket | None = None
        self.client: GenericEnvClient | None = None

    async def connect(self) -> None:
        if self.kind == "openenv":
            self.client = GenericEnvClient(base_url=self.url, headers=self.headers, connect_timeout_s=120,
                                           message_timeout_s=120)
            await self.client.connect()
        else:
            self.sock = await LeanSocket.open(self.url, self.headers, timeout=120)

    async def reset(self, **kwargs: Any) -> None:
        if self.client is not None:
            await self.client.reset(**kwargs)
        else:
            await self.sock.request({"type": "reset", "data": kwargs})

    async def step(self, action: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
        """(done, observation) of one step."""
        if self.client is not None:
            out = await self.client.step(action)
            return out.done, out.observation
        data = (await self.sock.request({"type": "step", "data": action}))["data"]
        return bool(data.get("done")), data.get("observation") or {}

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()
        elif self.sock is not None:
            await self.sock.close()


@contextlib.contextmanager
def server_process(name: str, cmd: list[str], env: dict[str, str], base_url: str, log_path: Path,
                   startup_timeout: float):
    """compare.server_process, yielding the process (its CPU time is read during the load)."""
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    try:
        wait_healthy(name, proc, base_url, log_path, startup_timeout)
        yield proc
    finally:
        stop_process(proc)


# What the reference process runs: the generated environment class, made concurrent, in create_app.
REFERENCE_APP = '''
import importlib, inspect, os, sys
sys.path.insert(0, os.environ["OE_PACKAGE_ROOT"])
import uvicorn
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
name = os.environ["OE_PACKAGE"]
module = importlib.import_module(f"{name}.server.{name}_environment")
cls = next(c for _, c in inspect.getmembers(module, inspect.isclass)
           if issubclass(c, Environment) and c.__module__ == module.__name__)
Concurrent = type(cls.__name__, (cls,), {"SUPPORTS_CONCURRENT_SESSIONS": True})
app = create_app(Concurrent, CallToolAction, CallToolObservation, env_name=name,
                 max_concurrent_envs=int(os.environ["OE_MAX_SESSIONS"]))
uvicorn.run(app, host="127.0.0.1", port=int(os.environ["OE_PORT"]), log_level="warning", access_log=False,
            loop="uvloop", http="httptools")
'''


# The reference for --sdk-env: the package's own app (its create_app call), as `uvicorn server.app:app`
# would serve it from the package folder.
REFERENCE_SDK_APP = '''
import os, sys
sys.path.insert(0, os.environ["OE_PACKAGE_ROOT"])
import uvicorn
from server.app import app
uvicorn.run(app, host="127.0.0.1", port=int(os.environ["OE_PORT"]), log_level="warning", access_log=False,
            loop="uvloop", http="httptools")
'''
SDK_ENV = "tally"


def sdk_package(workdir: Path) -> Path:
    """The OpenEnv-SDK package, written once per run (no pyproject.toml: see --sdk-env)."""
    root = workdir / "sdk" / f"{SDK_ENV}_env"
    if not root.is_dir():
        sys.path.insert(0, str(ROOT))
        from tests.catalog.openenv_packages import tally

        for name, text in tally().items():
            if name != "pyproject.toml":
                (root / name).parent.mkdir(parents=True, exist_ok=True)
                (root / name).write_text(text)
    return root


@dataclass
class Recorder:
    start: float = 0.0
    end: float = 0.0
    episodes: int = 0
    latencies: dict[str, list[float]] = field(default_factory=lambda: {"reset": [], "step": []})
    errors: dict[str, int] = field(default_factory=dict)

    def measuring(self, t0: float, t1: float) -> bool:
        return self.start <= t0 and t1 <= self.end

    def error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, max(0, int(round(p / 100 * len(values) + 0.5)) - 1))] * 1000


async def _episode_worker(url: str, headers: dict[str, str], rec: Recorder, stop: float, offset: int,
                          env: str) -> None:
    i = offset
    async with GenericEnvClient(base_url=url, headers=headers) as client:
        while time.monotonic() < stop:
            i += 1
            t0 = time.monotonic()
            try:
                reset = await client.reset(split="train", index=i % 1000)
                t1 = time.monotonic()
                spec = reset.observation["metadata"]["task_spec"]
                step = await client.step({"type": "call_tool", "tool_name": "submit",
                                          "arguments": {"answer": spec["answer"]}})
                t2 = time.monotonic()
            except Exception as exc:
                if time.monotonic() < stop:
                    rec.error(type(exc).__name__ + ": " + str(exc)[:80])
                return
            if step.reward != 1.0 or not step.done:
                rec.error(f"unexpected result reward={step.reward} done={step.done}")
            elif rec.measuring(t0, t2):
                rec.episodes += 1
                rec.latencies["reset"].append(t1 - t0)
                rec.latencies["step"].append(t2 - t1)


async def _sdk_episode_worker(url: str, headers: dict[str, str], rec: Recorder, stop: float, offset: int,
                              env: str) -> None:
    """An OpenEnv-SDK episode: reset with the environment's own argument, one tool call ending it."""
    i = offset
    async with GenericEnvClient(base_url=url, headers=headers) as client:
        while time.monotonic() < stop:
            i += 1
            target = 1 + i % 97
            t0 = time.monotonic()
            try:
                await client.reset(target=target)
                t1 = time.monotonic()
                step = await client.step({"type": "call_tool", "tool_name": "add", "arguments": {"amount": target}})
                t2 = time.monotonic()
            except Exception as exc:
                if time.monotonic() < stop:
                    rec.error(type(exc).__name__ + ": " + str(exc)[:80])
                return
            if step.reward != 1.0 or not step.done:
                rec.error(f"unexpected result reward={step.reward} done={step.done}")
            elif rec.measuring(t0, t2):
                rec.episodes += 1
                rec.latencies["reset"].append(t1 - t0)
                rec.latencies["step"].append(t2 - t1)


async def episodes_load(url: str, headers: dict[str, str], concurrency: int, duration: float, warmup: float,
                        env: str, server_pid: int | None = None, sdk: bool = False) -> dict[str, Any]:
    rec = Recorder()
    now = time.monotonic()
    rec.start, rec.end = now + warmup, now + warmup + duration
    worker = _sdk_episode_worker if sdk else _episode_worker
    workers = asyncio.gather(*[worker(url, headers, rec, rec.end, k * 7919, env) for k in range(concurrency)])
    await asyncio.sleep(warmup)
    cpu0, server0 = time.process_time(), tree_cpu_seconds(server_pid) if server_pid else 0.0
    await asyncio.sleep(duration)
    cpu1, server1 = time.process_time(), tree_cpu_seconds(server_pid) if server_pid else 0.0
    await workers
    return {"server_cpu_ms_per_episode": (server1 - server0) * 1000 / max(rec.episodes, 1),
            "client_cpu_ms_per_episode": (cpu1 - cpu0) * 1000 / max(rec.episodes, 1),"concurrency": concurrency, "episodes": rec.episodes, "episodes_per_s": rec.episodes / duration,
            "reset_p50_ms": pct(rec.latencies["reset"], 50), "reset_p99_ms": pct(rec.latencies["reset"], 99),
            "step_p50_ms": pct(rec.latencies["step"], 50), "step_p99_ms": pct(rec.latencies["step"], 99),
            "errors": rec.errors}


def reference_package(env: str, workdir: Path) -> str:
    """envs/<env> through upstream's ORS importer; returns the generated package's name."""
    name = f"{env}_env"
    if (workdir / "reference" / name).is_dir():
        return name  # generated for an earlier concurrency of this run
    run_command([str(Path(sys.executable).with_name("openenv")), "import", str(ROOT / "envs" / env), "--name", name,
                 "--output-dir", str(workdir / "reference"), "--type", "ors"], dict(os.environ), timeout=300)
    return name


@contextlib.contextmanager
def reference_server(env: str, workdir: Path, max_sessions: int, startup_timeout: float):
    name = reference_package(env, workdir)
    port = free_port()
    environ = {**os.environ, "OE_PACKAGE_ROOT": str(workdir / "reference"), "OE_PACKAGE": name,
               "OE_PORT": str(port), "OE_MAX_SESSIONS": str(max_sessions)}
    script = workdir / "reference_app.py"
    script.write_text(REFERENCE_APP)
    with server_process("reference (openenv create_app)", [sys.executable, str(script)], environ,
                        f"http://127.0.0.1:{port}", workdir / "reference.log", startup_timeout) as proc:
        yield f"http://127.0.0.1:{port}", proc


@contextlib.contextmanager
def reference_sdk_server(workdir: Path, max_sessions: int, startup_timeout: float):
    port = free_port()
    environ = {**os.environ, "OE_PACKAGE_ROOT": str(sdk_package(workdir)), "OE_PORT": str(port),
               "MAX_CONCURRENT_ENVS": str(max_sessions)}
    script = workdir / "reference_sdk_app.py"
    script.write_text(REFERENCE_SDK_APP)
    with server_process("reference (the package's own app)", [sys.executable, str(script)], environ,
                        f"http://127.0.0.1:{port}", workdir / "reference-sdk.log", startup_timeout) as proc:
        yield f"http://127.0.0.1:{port}", proc


@contextlib.contextmanager
def platform_server(database_url: str, workdir: Path, startup_timeout: float, server: str = "uvicorn",
                    sdk: bool = False):
    env = platform_env(database_url)
    api_key = prepare_platform(env)
    if sdk:
        manage(["publish_env", str(sdk_package(workdir)), "--team", "builtin", "--slug", SDK_ENV], env)
    port = free_port()
    with server_process(f"platform ({server})", platform_command(server, port), env, f"http://127.0.0.1:{port}",
                        workdir / f"platform-{server}.log", startup_timeout) as proc:
        yield f"http://127.0.0.1:{port}", api_key, proc


@contextlib.contextmanager
def database(args: argparse.Namespace, workdir: Path):
    if args.postgres:
        with postgres_database() as url:
            yield url
    else:
        yield os.environ.get("DATABASE_URL") or f"sqlite:///{workdir / 'bench.sqlite3'}"


def run_compare(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    results: dict[str, Any] = {"config": vars(args), "runs": []}
    sdk = args.sdk_env
    env = SDK_ENV if sdk else args.env
    for concurrency in args.concurrency:
        reference = (reference_sdk_server(workdir, max(concurrency * 2, 8), args.startup_timeout) if sdk else
                     reference_server(args.env, workdir, max(concurrency * 2, 8), args.startup_timeout))
        with reference as (url, proc):
            print(f"-- reference, concurrency {concurrency}", flush=True)
            ref = asyncio.run(episodes_load(url, {}, concurrency, args.duration, args.warmup, env, proc.pid, sdk))
        with database(args, workdir) as db, platform_server(db, workdir, args.startup_timeout, sdk=sdk) as (
                url, key, proc):
            print(f"-- platform, concurrency {concurrency}", flush=True)
            plat = asyncio.run(episodes_load(f"{url}/openenv/builtin/{env}", {"X-API-Key": key}, concurrency,
                                             args.duration, args.warmup, env, proc.pid, sdk))
        ratio = plat["episodes_per_s"] / ref["episodes_per_s"] if ref["episodes_per_s"] else float("nan")
        results["runs"].append({"concurrency": concurrency, "reference": ref, "platform": plat, "ratio": ratio})
        print(format_row("reference", ref), format_row("platform", plat), f"   ratio {ratio:.2f}", sep="\n",
              flush=True)
    return results


def format_row(label: str, r: dict[str, Any]) -> str:
    return (f"   {label:<10} c={r['concurrency']:<4} {r['episodes_per_s']:8.1f} episodes/s  "
            f"reset p50 {r['reset_p50_ms']:7.2f} p99 {r['reset_p99_ms']:8.2f} ms  "
            f"step p50 {r['step_p50_ms']:7.2f} p99 {r['step_p99_ms']:8.2f} ms  "
            f"CPU/episode server {r['server_cpu_ms_per_episode']:.2f} ms client {r['client_cpu_ms_per_episode']:.2f} ms  "
            f"errors {sum(r['errors'].values())} "
            f"{dict(list(r['errors'].items())[:3]) if r['errors'] else ''}")


# --- hold: many sockets open at once -------------------------------------------------------------


def hold_loop_run(main: Any, client: str) -> Any:
    """The hold's load generator on uvloop (as the server is) when it holds lean sockets: the load
    generator's CPU per step is CPU the server does not get on a shared box."""
    if client == "lean":
        with contextlib.suppress(ImportError):
            import uvloop
            return uvloop.run(main)
    return asyncio.run(main)


def run_hold(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    gc.set_threshold(50_000, *gc.get_threshold()[1:])  # as the server's (orsplatform/perimeter/heap.py)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, args.hold * 2 + 256)), hard))
    with database(args, workdir) as db, platform_server(db, workdir, args.startup_timeout) as (url, key, proc):
        print(f"-- platform: {args.hold} sockets, a step every {args.step_every:g}s for {args.duration:g}s",
              flush=True)
        load0, cpu0 = os.getloadavg()[0], tree_cpu_seconds(proc.pid)
        main = _hold_main(f"{url}/openenv/builtin/wordle", {"X-API-Key": key}, args, proc.pid)
        result = hold_loop_run(main, args.client)
        result["server_cpu_s"] = tree_cpu_seconds(proc.pid) - cpu0
        result["load"] = (load0, os.getloadavg()[0])
        with contextlib.suppress(Exception):
            result["server_log_tail"] = (workdir / "platform-uvicorn.log").read_text()[-2000:]
    return result


async def _hold_main(url: str, headers: dict[str, str], args: argparse.Namespace,
                     server_pid: int | None = None) -> dict[str, Any]:
    stats: dict[str, Any] = {"steps": 0, "step_errors": 0, "open_failed": 0, "sessions_ok": 0, "latencies": [],
                             "errors": {}, "timeline": []}
    opened = asyncio.Event()
    ready = [0]
    window = {"stop": float("inf")}
    t0 = time.monotonic()
    cpu0 = time.process_time()

    async def one(k: int) -> None:
        await asyncio.sleep(k / args.ramp)
        await _held_window(url, headers, args.step_every, window, stats, opened, ready, args.hold, args.client)

    tasks = [asyncio.create_task(one(k)) for k in range(args.hold)]
    await opened.wait()
    open_s = time.monotonic() - t0
    window["stop"] = time.monotonic() + args.duration
    print(f"   all {args.hold} sockets opened and reset in {open_s:.1f}s; holding", flush=True)
    # The server's CPU (its sandbox workers included) while held: per step, a figure the load of
    # other work on the machine barely moves, unlike the latencies.
    held_cpu0 = tree_cpu_seconds(server_pid) if server_pid else float("nan")
    with collector_off():  # the generator's own collections would stall every socket's step
        await asyncio.gather(*tasks)
    held_cpu = (tree_cpu_seconds(server_pid) if server_pid else float("nan")) - held_cpu0
    lat = stats.pop("latencies")
    step_max = max(lat) * 1000 if lat else float("nan")
    # Per 5-second slice of the window: steps started, their p99 and max (where slow steps cluster).
    start = window["stop"] - args.duration
    slices: dict[int, list[float]] = {}
    for t, latency in stats.pop("timeline"):
        slices.setdefault(int((t - start) // 5) * 5, []).append(latency)
    timeline = {f"{k}s": {"steps": len(v), "p99_ms": round(pct(v, 99), 1), "max_ms": round(max(v) * 1000, 1)}
                for k, v in sorted(slices.items())}
    return {"sessions": args.hold, "open_s": open_s, "open_failed": stats["open_failed"],
            "sessions_ok": stats["sessions_ok"], "success_rate": stats["sessions_ok"] / args.hold,
            "steps": stats["steps"], "step_errors": stats["step_errors"], "steps_per_s": stats["steps"] / args.duration,
            "step_p50_ms": pct(lat, 50), "step_p99_ms": pct(lat, 99), "step_max_ms": step_max,
            "errors": stats["errors"], "server_cpu_ms_per_step": held_cpu * 1000 / max(stats["steps"], 1),
            "client_cpu_s": time.process_time() - cpu0, "timeline": timeline}


async def _held_window(url: str, headers: dict[str, str], every: float, window: dict[str, float],
                       stats: dict[str, Any], opened: asyncio.Event, ready: list[int], target: int,
                       kind: str = "lean") -> None:
    def note(exc: Exception) -> None:
        key = type(exc).__name__ + ": " + str(exc)[:100]
        stats["errors"][key] = stats["errors"].get(key, 0) + 1

    def arrived() -> None:
        ready[0] += 1
        if ready[0] >= target:
            opened.set()

    client = _HeldClient(url, headers, kind)
    try:
        await client.connect()
        await client.reset(split="test", index=random.randrange(80))
    except Exception as exc:
        stats["open_failed"] += 1
        note(exc)
        arrived()
        return
    arrived()
    await opened.wait()
    await asyncio.sleep(random.uniform(0, every))
    ok = True
    while time.monotonic() < window["stop"]:
        t0 = time.monotonic()
        try:
            # An invalid guess uses no turn: a real, recorded tool call that never ends the game.
            done, observation = await client.step({"type": "call_tool", "tool_name": "guess",
                                                   "arguments": {"word": "zz"}})
            if done or observation.get("error"):
                raise RuntimeError(f"unexpected step result {observation}")
            stats["steps"] += 1
            stats["latencies"].append(time.monotonic() - t0)
            stats["timeline"].append((t0, time.monotonic() - t0))
        except Exception as exc:
            stats["step_errors"] += 1
            note(exc)
            ok = False
            break
        await asyncio.sleep(max(0.0, every * random.uniform(0.8, 1.2) - (time.monotonic() - t0)))
    stats["sessions_ok"] += ok
    with contextlib.suppress(Exception):
        await client.close()


def hold_line(r: dict[str, Any]) -> str:
    """The one-line summary of a hold run (as bench/hold_ors.py prints for ORS sessions)."""
    load = r.get("load", (float("nan"), float("nan")))
    return (f"HOLD openenv sockets={r['sessions']} held={100 * r['success_rate']:.1f}% open_failed={r['open_failed']} "
            f"failed={r['step_errors']} steps/s={r['steps_per_s']:.0f} step_p50={r['step_p50_ms']:.1f}ms "
            f"step_p99={r['step_p99_ms']:.1f}ms step_max={r['step_max_ms']:.1f}ms "
            f"server_cpu={r.get('server_cpu_s', float('nan')):.1f}s "
            f"server_cpu/step={r.get('server_cpu_ms_per_step', float('nan')):.2f}ms client_cpu={r['client_cpu_s']:.1f}s "
            f"load={load[0]:.1f}->{load[1]:.1f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="math", help="bundled environment for compare mode (needs submit/answer)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--sdk-env", action="store_true",
                        help="compare on an environment written against OpenEnv's SDK (tally), hosted here "
                             "against its own app on OpenEnv's server")
    parser.add_argument("--postgres", action="store_true", help="the platform on a fresh PostgreSQL database")
    parser.add_argument("--hold", type=int, default=0, help="hold mode: this many sockets open at once")
    parser.add_argument("--step-every", type=float, default=5.0)
    parser.add_argument("--client", choices=["lean", "openenv"], default="lean",
                        help="hold mode: bench/lean_ws.py (default) or the unmodified GenericEnvClient per socket")
    parser.add_argument("--ramp", type=float, default=200.0, help="hold mode: sockets opened per second")
    parser.add_argument("--startup-timeout", type=float, default=120.0)
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args(argv)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    with tempfile.TemporaryDirectory(prefix="oebench-") as tmp:
        workdir = Path(tmp)
        try:
            result = run_hold(args, workdir) if args.hold else run_compare(args, workdir)
        except SetupError as exc:
            print(f"setup failed: {exc}", file=sys.stderr)
            return 2
    if args.hold:
        summary = {k: v for k, v in result.items() if k != "server_log_tail"}
        print(json.dumps(summary, indent=2, default=str))
        print(hold_line(result), flush=True)
    if args.json_out:
        args.json_out.write_text(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
