"""Many ORS sessions held open on one platform process, each on its own connection.

    .venv/bin/python bench/hold_ors.py --hold 8192 --duration 60
    .venv/bin/python bench/hold_ors.py --hold 16384 --duration 60 --ramp 300

The ORS counterpart of ``bench/openenv_compare.py --hold``. A platform is started here (uvicorn with
the perimeter's protocol, as ``make run``; API keys on, every call in the audit log), then
``--hold N`` sessions are opened against it at ``--ramp`` per second: ``create_session`` (SSE),
``create`` on a task of wordle's test split and ``prompt`` (a ``503`` "still starting" waited out
and retried, as the openreward client does, each wait counted in ``starting_waits``), each request on a connection of its
own (a session's requests are seconds apart, past what a keep-alive pool would keep: see Held). Once all are open they are held for ``--duration`` seconds: each calls a tool every
``--step-every`` seconds (a ``guess`` of an invalid word, which uses no turn: a real, recorded call
over SSE that never ends the game) and pings every ``--ping`` seconds (as the ORS client does),
both jittered. Prints one ``HOLD ors`` summary line (held %, errors, call and ping p50/p99/max, the
load average) and, with --json-out, the details (a per-5-second timeline of call latency).
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
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

try:  # run as a script (bench/ on sys.path) or imported as bench.hold_ors
    from compare import (
        SetupError,
        free_port,
        platform_command,
        platform_env,
        postgres_database,
        prepare_platform,
        server_process,
        tree_cpu_seconds,
    )
    from lean_http import LeanConnection, sse_events
    from loadgen import collector_off, install_fast_loop, percentile
except ImportError:  # pragma: no cover
    from bench.compare import (
        SetupError,
        free_port,
        platform_command,
        platform_env,
        postgres_database,
        prepare_platform,
        server_process,
        tree_cpu_seconds,
    )
    from bench.lean_http import LeanConnection, sse_events
    from bench.loadgen import collector_off, install_fast_loop, percentile

ENV = "wordle"
TEST_TASKS = 80  # wordle's test split
STARTING_SECONDS = 300.0
GUESS = orjson.dumps({"name": "guess", "input": {"word": "zz"}})


class HoldFailed(Exception):
    pass


class Held:
    """One ORS session and its own connection."""

    def __init__(self, base_url: str, api_key: str, timeout: float, keep_alive: float = 0.0) -> None:
        self.base_url = base_url
        # The session's connection is kept between its requests for `keep_alive` seconds (an HTTP
        # client's pool; httpx keeps one 5 s), below the server's own 5 s (uvicorn's
        # --timeout-keep-alive under `make run`): a client reusing a connection the server was
        # closing would fail its request (a keep-alive race, not a server error). 0: a connection
        # per request (a client without a pool, or one whose requests are further apart).
        self.http = LeanConnection(base_url, keep_alive=keep_alive, timeout=timeout)
        self.headers = {"Content-Type": "application/json", "X-API-Key": api_key}
        self.sid = ""
        self.starting_waits = 0

    async def _sse(self, path: str, body: bytes) -> list[tuple[str, str]]:
        headers = {**self.headers, "Accept": "text/event-stream"}
        if self.sid:
            headers["X-Session-ID"] = self.sid
        status, raw = await self.http.request("POST", path, headers, body)
        if status != 200:
            raise HoldFailed(f"{path}: HTTP {status}: {raw[:100]!r}")
        events = sse_events(raw)
        for name, data in events:
            if name == "error":
                raise HoldFailed(f"{path}: error event {data[:100]}")
        return events

    async def _json(self, method: str, path: str, body: bytes | None) -> Any:
        headers = {**self.headers, "X-Session-ID": self.sid}
        status, raw = await self.http.request(method, path, headers, body or b"")
        if status != 200:
            raise HoldFailed(f"{path}: HTTP {status}: {raw[:100]!r}")
        return orjson.loads(raw)

    async def open(self, index: int) -> None:
        events = await self._sse("/create_session", b"{}")
        self.sid = next((data for name, data in events if name == "task_id"), "")
        if not self.sid:
            raise HoldFailed("create_session: no task_id event")
        await self._json("POST", "/create", orjson.dumps({"env_name": ENV, "split": "test", "index": index}))
        # A 503 "still starting" (X-Backend-State: starting, Retry-After: 2) is the wire's "wait":
        # the openreward client rides it out for minutes (shared/ORS_WIRE.md), and so does this one,
        # counting each wait; any other answer, or starting past STARTING_SECONDS, fails the session.
        deadline = time.monotonic() + STARTING_SECONDS
        while True:
            try:
                await self._json("GET", f"/{ENV}/prompt", None)
                return
            except HoldFailed as exc:
                if "HTTP 503" not in str(exc) or "still starting" not in str(exc) or time.monotonic() > deadline:
                    raise
                self.starting_waits += 1
                await asyncio.sleep(2.0)

    async def call(self) -> None:
        events = await self._sse(f"/{ENV}/call", GUESS)
        result = orjson.loads("".join(data for name, data in events if name in ("chunk", "end")))
        if not isinstance(result, dict) or result.get("ok") is not True or result["output"].get("finished"):
            raise HoldFailed(f"unexpected call result {str(result)[:100]}")

    async def ping(self) -> None:
        await self._json("POST", "/ping", b"{}")

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            if self.sid:
                await self._json("POST", "/delete", b"{}")
        await self.http.close()


async def hold(base_url: str, api_key: str, args: argparse.Namespace, server_pid: int | None = None) -> dict[str, Any]:
    stats: dict[str, Any] = {"open_failed": 0, "failed": 0, "ok": 0, "calls": [], "pings": [], "timeline": [],
                             "errors": {}, "starting_waits": 0}
    opened, ready = asyncio.Event(), [0]
    window = {"start": float("inf"), "stop": float("inf")}

    def note(exc: BaseException) -> None:
        key = f"{type(exc).__name__}: {str(exc)[:100]}"
        stats["errors"][key] = stats["errors"].get(key, 0) + 1

    def arrived() -> None:
        ready[0] += 1
        if ready[0] >= args.hold:
            opened.set()

    async def session(k: int) -> None:
        await asyncio.sleep(k / args.ramp)
        held = Held(base_url, api_key, args.request_timeout, args.keep_alive)
        try:
            try:
                await held.open(k % TEST_TASKS)
            except Exception as exc:
                stats["open_failed"] += 1
                note(exc)
                return
            finally:
                stats["starting_waits"] += held.starting_waits
                arrived()
            await opened.wait()
            now = time.monotonic()
            next_call = now + random.uniform(0, args.step_every)
            next_ping = now + random.uniform(0, args.ping)
            while True:
                moment = min(next_call, next_ping)
                if moment >= window["stop"]:
                    break
                await asyncio.sleep(max(0.0, moment - time.monotonic()))
                t0 = time.monotonic()
                try:
                    if next_call <= next_ping:
                        await held.call()
                        latency = time.monotonic() - t0
                        stats["calls"].append(latency)
                        stats["timeline"].append((t0, latency))
                        next_call = t0 + args.step_every * random.uniform(0.8, 1.2)
                    else:
                        await held.ping()
                        stats["pings"].append(time.monotonic() - t0)
                        next_ping = t0 + args.ping * random.uniform(0.9, 1.1)
                except Exception as exc:
                    stats["failed"] += 1
                    note(exc)
                    return
            stats["ok"] += 1
        finally:
            await held.close()

    t0 = time.monotonic()
    tasks = [asyncio.create_task(session(k)) for k in range(args.hold)]
    await opened.wait()
    open_s = time.monotonic() - t0
    window["start"] = time.monotonic()
    window["stop"] = window["start"] + args.duration
    print(f"   all {args.hold} sessions opened in {open_s:.1f}s ({stats['open_failed']} failed); holding", flush=True)
    cpu0 = time.process_time()
    # The server's CPU while held, per call (pings included): see openenv_compare.py.
    held_cpu0 = tree_cpu_seconds(server_pid) if server_pid else float("nan")
    with collector_off():  # the generator's own collections would stall every request it times
        await asyncio.gather(*tasks)
    held_cpu = (tree_cpu_seconds(server_pid) if server_pid else float("nan")) - held_cpu0
    slices: dict[int, list[float]] = {}
    for t, latency in stats["timeline"]:
        slices.setdefault(int((t - window["start"]) // 5) * 5, []).append(latency)
    calls, pings = sorted(stats["calls"]), sorted(stats["pings"])
    return {
        "sessions": args.hold, "open_s": open_s, "open_failed": stats["open_failed"], "failed": stats["failed"],
        "held_pct": 100 * stats["ok"] / args.hold, "calls": len(calls), "calls_per_s": len(calls) / args.duration,
        "call_p50_ms": percentile(calls, 50) * 1000, "call_p99_ms": percentile(calls, 99) * 1000,
        "call_max_ms": (calls[-1] * 1000) if calls else float("nan"),
        "pings": len(pings), "ping_p50_ms": percentile(pings, 50) * 1000, "ping_p99_ms": percentile(pings, 99) * 1000,
        "errors": stats["errors"], "starting_waits": stats["starting_waits"], "client_cpu_s": time.process_time() - cpu0,
        "server_cpu_ms_per_call": held_cpu * 1000 / max(len(calls), 1),
        "timeline": {f"{k}s": {"calls": len(v), "p99_ms": round(percentile(sorted(v), 99) * 1000, 1),
                               "max_ms": round(max(v) * 1000, 1)} for k, v in sorted(slices.items())},
    }


def summary_line(r: dict[str, Any], load: tuple[float, float]) -> str:
    return (f"HOLD ors sessions={r['sessions']} held={r['held_pct']:.1f}% open_failed={r['open_failed']} "
            f"failed={r['failed']} starting_waits={r['starting_waits']} calls/s={r['calls_per_s']:.0f} call_p50={r['call_p50_ms']:.1f}ms "
            f"call_p99={r['call_p99_ms']:.1f}ms call_max={r['call_max_ms']:.1f}ms ping_p50={r['ping_p50_ms']:.1f}ms "
            f"ping_p99={r['ping_p99_ms']:.1f}ms server_cpu={r.get('server_cpu_s', float('nan')):.1f}s "
            f"server_cpu/call={r['server_cpu_ms_per_call']:.2f}ms "
            f"client_cpu={r['client_cpu_s']:.1f}s load={load[0]:.1f}->{load[1]:.1f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hold", type=int, default=1000, help="sessions held open at once")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds held (measured)")
    parser.add_argument("--step-every", type=float, default=5.0, help="seconds between a session's tool calls")
    parser.add_argument("--ping", type=float, default=10.0, help="seconds between a session's pings")
    parser.add_argument("--ramp", type=float, default=200.0, help="sessions opened per second")
    parser.add_argument("--keep-alive", type=float, default=4.0,
                        help="seconds a session keeps its idle connection (0: a connection per request)")
    parser.add_argument("--request-timeout", type=float, default=120.0)
    parser.add_argument("--postgres", action="store_true", help="the platform on a fresh PostgreSQL database")
    parser.add_argument("--startup-timeout", type=float, default=120.0)
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args(argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, args.hold + 256)), hard))
    gc.set_threshold(50_000, *gc.get_threshold()[1:])  # as the server's (orsplatform/perimeter/heap.py)
    install_fast_loop()
    with tempfile.TemporaryDirectory(prefix="orshold-") as tmp:
        workdir = Path(tmp)
        try:
            with (postgres_database() if args.postgres else contextlib.nullcontext(
                    os.environ.get("DATABASE_URL") or f"sqlite:///{workdir / 'bench.sqlite3'}")) as db:
                env = platform_env(db)
                api_key = prepare_platform(env)
                port = free_port()
                url = f"http://127.0.0.1:{port}"
                with server_process("platform (uvicorn)", platform_command("uvicorn", port), env, url,
                                    workdir / "platform.log", args.startup_timeout) as proc:
                    print(f"-- platform: {args.hold} ORS sessions, a call every {args.step_every:g}s and a ping "
                          f"every {args.ping:g}s for {args.duration:g}s", flush=True)
                    load0 = os.getloadavg()[0]
                    cpu0 = tree_cpu_seconds(proc.pid)
                    result = asyncio.run(hold(url, api_key, args, proc.pid))
                    result["server_cpu_s"] = tree_cpu_seconds(proc.pid) - cpu0
                    load = (load0, os.getloadavg()[0])
        except SetupError as exc:
            print(f"setup failed: {exc}", file=sys.stderr)
            return 2
    print(summary_line(result, load), flush=True)
    if args.json_out:
        args.json_out.write_text(json.dumps(result, indent=2, default=str))
    return 0 if result["held_pct"] == 100.0 else 1


if __name__ == "__main__":
    sys.exit(main())
