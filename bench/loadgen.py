"""Closed-loop ORS load generator.

Each of N workers runs whole episodes back to back (create_session, create, prompt, call, delete)
against one ORS server, sharing one keep-alive aiohttp session. Requests are timed to their full
response (for SSE, to the `end` event). Only the window after the warm-up counts.

    .venv/bin/python bench/loadgen.py --base-url http://127.0.0.1:8080 --concurrency 16 --duration 20

`run_load(...)` is the programmatic entry point (used by bench/compare.py) and returns a plain dict.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import itertools
import json
import math
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

ENDPOINTS: tuple[str, ...] = ("create_session", "create", "prompt", "call", "delete")
REQUEST_TIMEOUT_S = 30.0
# Sessions still open when the deadline cancels the workers are deleted best-effort within this bound,
# so a benchmark run does not leave live episodes behind on a shared platform.
CLEANUP_TIMEOUT_S = 5.0
MAX_ERROR_SAMPLES = 5
INDEX_MODE_TASKS = 1000
SPEC_MODE_TASKS = 200
WRONG_ANSWER = "__bench_wrong_answer__"


class EpisodeError(Exception):
    """A failed step; `kind` is the HTTP status or a short tag (timeout, conn, sse-error, reward...)."""

    def __init__(self, endpoint: str, kind: str, message: str) -> None:
        super().__init__(f"{endpoint} [{kind}] {message}")
        self.endpoint = endpoint
        self.kind = kind


@dataclass
class Recorder:
    """Collects samples; only what starts and ends inside [measure_start, deadline] is measured."""

    measure_start: float
    deadline: float
    latencies: dict[str, list[float]] = field(default_factory=lambda: {e: [] for e in ENDPOINTS})
    errors: Counter[str] = field(default_factory=Counter)
    warmup_errors: int = 0
    error_samples: list[str] = field(default_factory=list)
    episodes: int = 0

    def request(self, endpoint: str, started: float, finished: float) -> None:
        if started >= self.measure_start and finished <= self.deadline:
            self.latencies[endpoint].append(finished - started)

    def episode_done(self, finished: float) -> None:
        # Throughput = completions inside the window; in a closed loop at steady state an episode that
        # began during warm-up and ends inside the window balances one still in flight at the deadline.
        if self.measure_start <= finished <= self.deadline:
            self.episodes += 1

    def error(self, err: EpisodeError) -> None:
        now = time.perf_counter()
        if now > self.deadline:
            return
        if now < self.measure_start:
            self.warmup_errors += 1
        else:
            self.errors[f"{err.endpoint} {err.kind}"] += 1
        # Samples include warm-up errors (the first failure is usually the most telling one) and are
        # distinct, so one repeated failure does not hide a second kind.
        sample = str(err)[:300]
        if len(self.error_samples) < MAX_ERROR_SAMPLES and sample not in self.error_samples:
            self.error_samples.append(sample)


@dataclass(frozen=True)
class PlannedTask:
    create_body: bytes
    answer: str
    expected_reward: float


class TaskPlan:
    """Cycles through the prepared tasks; shared by all workers (single event loop, so no lock)."""

    def __init__(self, tasks: list[PlannedTask]) -> None:
        self._cycle: Iterator[PlannedTask] = itertools.cycle(tasks)

    def next(self) -> PlannedTask:
        return next(self._cycle)


class OrsClient:
    """The five episode requests, each timed and mapped to EpisodeError on any failure."""

    def __init__(
        self, http: aiohttp.ClientSession, base_url: str, env: str, api_key: str | None, recorder: Recorder
    ) -> None:
        self.http = http
        # Several comma-separated base URLs: requests rotate over them with no stickiness, so one
        # episode is served by several gateways (the celery executor's shared sessions).
        self.base_urls = [u.rstrip("/") for u in base_url.split(",") if u.strip()]
        self._turn = 0
        self.env = env
        self.recorder = recorder
        self.headers: dict[str, str] = {"Content-Type": "application/json"}
        if api_key:
            self.headers["X-API-Key"] = api_key

    def _url(self, path: str) -> str:
        self._turn += 1
        return self.base_urls[self._turn % len(self.base_urls)] + path

    def _session_headers(self, sid: str, sse: bool = False) -> dict[str, str]:
        headers = {**self.headers, "X-Session-ID": sid}
        if sse:
            headers["Accept"] = "text/event-stream"
        return headers

    async def create_session(self) -> str:
        headers = {**self.headers, "Accept": "text/event-stream"}
        events = await self._sse("create_session", "/create_session", headers, b"{}")
        sid = next((data for name, data in events if name == "task_id"), "")
        if not sid:
            raise EpisodeError("create_session", "bad-response", f"no task_id event in {events!r:.200}")
        return sid

    async def create(self, sid: str, body: bytes) -> None:
        await self._json("create", "POST", "/create", self._session_headers(sid), body)

    async def prompt(self, sid: str) -> None:
        blocks = await self._json("prompt", "GET", f"/{self.env}/prompt", self._session_headers(sid), None)
        if not isinstance(blocks, list) or not blocks:
            raise EpisodeError(
                "prompt", "bad-response", f"expected a non-empty block list, got {blocks!r:.200}"
            )

    async def call(self, sid: str, answer: str) -> dict[str, Any]:
        body = orjson.dumps({"name": "submit", "input": {"answer": answer}})
        events = await self._sse("call", f"/{self.env}/call", self._session_headers(sid, sse=True), body)
        payload = "".join(data for name, data in events if name in ("chunk", "end"))
        try:
            result = orjson.loads(payload)
        except orjson.JSONDecodeError as exc:
            raise EpisodeError("call", "bad-response", f"end payload is not JSON: {payload!r:.200}") from exc
        if not isinstance(result, dict) or result.get("ok") is not True:
            raise EpisodeError("call", "not-ok", f"{result!r:.200}")
        return result

    async def delete(self, sid: str) -> None:
        await self._json("delete", "POST", "/delete", self._session_headers(sid), b"{}")

    async def _json(
        self, endpoint: str, method: str, path: str, headers: dict[str, str], body: bytes | None
    ) -> Any:
        started = time.perf_counter()
        try:
            async with self.http.request(method, self._url(path), headers=headers, data=body) as resp:
                raw = await resp.read()
                finished = time.perf_counter()
                if resp.status >= 300:
                    raise EpisodeError(endpoint, str(resp.status), raw[:200].decode(errors="replace"))
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _transport_error(endpoint, exc) from exc
        self.recorder.request(endpoint, started, finished)
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise EpisodeError(endpoint, "bad-response", f"not JSON: {raw[:200]!r}") from exc

    async def _sse(
        self, endpoint: str, path: str, headers: dict[str, str], body: bytes
    ) -> list[tuple[str, str]]:
        """POST and collect SSE events up to `end`; the latency sample stops at `end`."""
        started = time.perf_counter()
        events: list[tuple[str, str]] = []
        try:
            async with self.http.post(self._url(path), headers=headers, data=body) as resp:
                if resp.status >= 300:
                    raw = await resp.read()
                    raise EpisodeError(endpoint, str(resp.status), raw[:200].decode(errors="replace"))
                ctype = resp.headers.get("Content-Type", "")
                if not ctype.startswith("text/event-stream"):
                    # Real clients parse only SSE here, so a JSON answer is a wire bug, not a fallback.
                    raw = await resp.read()
                    raise EpisodeError(endpoint, "bad-response", f"Content-Type {ctype!r}: {raw[:200]!r}")
                async for name, data in iter_sse(resp.content):
                    if name == "error":
                        raise EpisodeError(endpoint, "sse-error", data[:200])
                    events.append((name, data))
                    if name == "end":
                        break
                finished = time.perf_counter()
                if not events or events[-1][0] != "end":
                    raise EpisodeError(
                        endpoint, "bad-response", f"stream ended without `end`: {events!r:.200}"
                    )
                # Drain to EOF so aiohttp returns the connection to the keep-alive pool instead of closing it.
                await resp.content.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _transport_error(endpoint, exc) from exc
        self.recorder.request(endpoint, started, finished)
        return events


def _transport_error(endpoint: str, exc: BaseException) -> EpisodeError:
    kind = "timeout" if isinstance(exc, TimeoutError) else "conn"
    return EpisodeError(endpoint, kind, f"{type(exc).__name__}: {exc}")


class SseParser:
    """Server-sent events, a line at a time: ``line`` returns (event, data) when a blank line ends
    an event; comment lines (``: ping``) are skipped. ``end`` returns an event the stream closed on
    without its trailing blank line."""

    def __init__(self) -> None:
        self.event, self.data = "", []

    def line(self, line: str) -> tuple[str, str] | None:
        if not line:
            return self.end()
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "event":
            self.event = value
        elif name == "data":
            self.data.append(value)
        return None

    def end(self) -> tuple[str, str] | None:
        done = (self.event or "message", "\n".join(self.data)) if self.event or self.data else None
        self.event, self.data = "", []
        return done


async def iter_sse(stream: aiohttp.StreamReader) -> AsyncIterator[tuple[str, str]]:
    """(event, data) pairs of a streamed SSE answer, as they arrive."""
    parser = SseParser()
    async for raw in stream:
        if (event := parser.line(raw.decode().rstrip("\r\n"))) is not None:
            yield event
    if (event := parser.end()) is not None:
        yield event


async def run_episode(client: OrsClient, task: PlannedTask, open_sids: set[str]) -> None:
    sid = await client.create_session()
    # Tracked until its /delete completes: if the deadline cancels us mid-episode, the run's cleanup
    # deletes it (a repeated /delete is harmless).
    open_sids.add(sid)
    try:
        await play(client, sid, task)
    except EpisodeError:
        # Delete anyway so failures do not pile up live sessions; the failed step is what gets reported.
        with contextlib.suppress(EpisodeError):
            await client.delete(sid)
        open_sids.discard(sid)
        raise
    await client.delete(sid)
    open_sids.discard(sid)
    client.recorder.episode_done(time.perf_counter())


async def play(client: OrsClient, sid: str, task: PlannedTask) -> None:
    await client.create(sid, task.create_body)
    await client.prompt(sid)
    result = await client.call(sid, task.answer)
    output = result.get("output")
    reward = output.get("reward") if isinstance(output, dict) else None
    if reward != task.expected_reward:
        raise EpisodeError("call", "reward", f"reward {reward!r}, expected {task.expected_reward}")


async def worker(client: OrsClient, plan: TaskPlan, open_sids: set[str]) -> None:
    while time.perf_counter() < client.recorder.deadline:
        try:
            await run_episode(client, plan.next(), open_sids)
        except EpisodeError as err:
            client.recorder.error(err)
            # A dead server fails instantly; a short pause keeps the closed loop from spinning the CPU.
            await asyncio.sleep(0.05)


async def fetch_tasks(
    http: aiohttp.ClientSession, base_url: str, env: str, api_key: str | None, stop: int
) -> list[dict[str, Any]]:
    """One task_range request before the run, so answers never cost a request inside an episode."""
    headers = {"Content-Type": "application/json", **({"X-API-Key": api_key} if api_key else {})}
    body = orjson.dumps({"split": "train", "start": 0, "stop": stop})
    async with http.post(f"{base_url.rstrip('/')}/{env}/task_range", headers=headers, data=body) as resp:
        raw = await resp.read()
        if resp.status != 200:
            raise RuntimeError(f"task_range failed: HTTP {resp.status}: {raw[:300]!r}")
    data = orjson.loads(raw)
    tasks = data.get("tasks") if isinstance(data, dict) else None
    if not isinstance(tasks, list) or not tasks:
        raise RuntimeError(f"task_range returned no tasks: {raw[:300]!r}")
    return tasks


def plan_tasks(tasks: list[dict[str, Any]], env: str, task_mode: str, answer_mode: str) -> list[PlannedTask]:
    planned = []
    for index, task in enumerate(tasks):
        if task_mode == "index":
            create = {"env_name": env, "split": "train", "index": index}
        else:
            create = {"env_name": env, "task_spec": task}
        if answer_mode == "correct":
            planned.append(PlannedTask(orjson.dumps(create), str(task["answer"]), 1.0))
        else:
            planned.append(PlannedTask(orjson.dumps(create), WRONG_ANSWER, 0.0))
    return planned


def percentile(sorted_values: list[float], pct: float) -> float:
    """Nearest-rank percentile of an ascending list (no interpolation, so p99 is a real sample)."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(pct / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def summarize(recorder: Recorder, duration: float, cpu_seconds: float) -> dict[str, Any]:
    endpoints: dict[str, dict[str, float]] = {}
    for endpoint, samples in recorder.latencies.items():
        ordered = sorted(samples)
        endpoints[endpoint] = {
            "count": len(ordered),
            "p50_ms": percentile(ordered, 50) * 1000,
            "p90_ms": percentile(ordered, 90) * 1000,
            "p99_ms": percentile(ordered, 99) * 1000,
            "mean_ms": (sum(ordered) / len(ordered) * 1000) if ordered else math.nan,
        }
    return {
        "episodes": recorder.episodes,
        "episodes_per_s": recorder.episodes / duration,
        "errors": sum(recorder.errors.values()),
        "errors_by": dict(recorder.errors),
        "warmup_errors": recorder.warmup_errors,
        "error_samples": list(recorder.error_samples),
        "endpoints": endpoints,
        # The client shares the machine with the server; near 100 % means the client is the bottleneck.
        "client_cpu_pct": 100 * cpu_seconds / duration,
    }


async def run_load(
    base_url: str,
    env: str = "math",
    concurrency: int = 16,
    duration: float = 20.0,
    warmup: float = 3.0,
    api_key: str | None = None,
    task_mode: str = "index",
    answer: str = "correct",
) -> dict[str, Any]:
    """Run the closed loop and return the summary dict (see `summarize`)."""
    if task_mode not in ("index", "spec") or answer not in ("correct", "wrong") or concurrency < 1:
        raise ValueError(f"bad task_mode={task_mode!r}, answer={answer!r} or concurrency={concurrency}")
    connector = aiohttp.TCPConnector(limit=concurrency * 2, limit_per_host=concurrency * 2)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        stop = INDEX_MODE_TASKS if task_mode == "index" else SPEC_MODE_TASKS
        tasks = await fetch_tasks(http, base_url.split(",")[0], env, api_key, stop)
        plan = TaskPlan(plan_tasks(tasks, env, task_mode, answer))

        measure_start = time.perf_counter() + warmup
        recorder = Recorder(measure_start=measure_start, deadline=measure_start + duration)
        client = OrsClient(http, base_url, env, api_key, recorder)
        open_sids: set[str] = set()
        workers = [asyncio.create_task(worker(client, plan, open_sids)) for _ in range(concurrency)]

        cpu_at_start = await _cpu_at(measure_start)
        await asyncio.wait(workers, timeout=max(0.0, recorder.deadline - time.perf_counter()))
        cpu_seconds = time.process_time() - cpu_at_start
        await _cancel_all(workers)
        await _cleanup_sessions(client, open_sids)

    summary = summarize(recorder, duration, cpu_seconds)
    summary.update(
        base_url=base_url,
        env=env,
        concurrency=concurrency,
        duration_s=duration,
        warmup_s=warmup,
        task_mode=task_mode,
        answer=answer,
        tasks_cycled=len(tasks),
    )
    return summary


async def _cpu_at(moment: float) -> float:
    await asyncio.sleep(max(0.0, moment - time.perf_counter()))
    return time.process_time()


async def _cancel_all(workers: list[asyncio.Task[None]]) -> None:
    for task in workers:
        task.cancel()
    # Cancelled aiohttp requests just drop their connection, so this returns promptly; bounded anyway.
    await asyncio.wait(workers, timeout=CLEANUP_TIMEOUT_S)


async def _cleanup_sessions(client: OrsClient, open_sids: set[str]) -> None:
    if not open_sids:
        return
    # Results after the deadline are never recorded (Recorder ignores them), so errors are dropped here.
    deletes = [asyncio.create_task(client.delete(sid)) for sid in list(open_sids)]
    done, pending = await asyncio.wait(deletes, timeout=CLEANUP_TIMEOUT_S)
    for task in pending:
        task.cancel()
    for task in done:
        task.exception()  # mark retrieved; a failed best-effort delete is not worth reporting


def format_table(result: dict[str, Any], title: str = "") -> str:
    lines = []
    if title:
        lines.append(f"== {title} ==")
    lines.append(
        f"{result['base_url']}  env={result['env']}  concurrency={result['concurrency']}  "
        f"duration={result['duration_s']:g}s (+{result['warmup_s']:g}s warm-up)  "
        f"tasks={result['task_mode']}/{result['answer']}"
    )
    lines.append(
        f"episodes/s {result['episodes_per_s']:.1f}   episodes {result['episodes']}   "
        f"errors {result['errors']}   warm-up errors {result['warmup_errors']}   "
        f"client CPU {result['client_cpu_pct']:.0f}%"
    )
    if result["episodes"] == 0:
        lines.append("WARNING: no episode completed in the measured window (server hung or too slow?)")
    lines.append(f"{'endpoint':<16}{'count':>8}{'p50 ms':>10}{'p90 ms':>10}{'p99 ms':>10}")
    for endpoint, stats in result["endpoints"].items():
        lines.append(
            f"{endpoint:<16}{stats['count']:>8}{stats['p50_ms']:>10.2f}"
            f"{stats['p90_ms']:>10.2f}{stats['p99_ms']:>10.2f}"
        )
    for key, count in sorted(result["errors_by"].items()):
        lines.append(f"  error {key}: {count}")
    for sample in result["error_samples"]:
        lines.append(f"  e.g. {sample}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Closed-loop ORS episode load generator.")
    parser.add_argument("--base-url", required=True, help="ORS server root, e.g. http://127.0.0.1:8080")
    parser.add_argument("--env", default="math", help="environment name in /{env}/... paths")
    parser.add_argument("--concurrency", type=int, default=16, help="number of closed-loop workers")
    parser.add_argument("--duration", type=float, default=20.0, help="measured seconds")
    parser.add_argument("--warmup", type=float, default=3.0, help="unmeasured seconds before measuring")
    parser.add_argument("--api-key", default=None, help="sent as X-API-Key on every request")
    parser.add_argument(
        "--task-mode",
        choices=("index", "spec"),
        default="index",
        help="/create with split+index (cycling 0..999) or with a task_spec (200 tasks)",
    )
    parser.add_argument(
        "--answer",
        choices=("correct", "wrong"),
        default="correct",
        help="submit the task's answer (expect reward 1.0) or a wrong one (expect 0.0)",
    )
    parser.add_argument("--json-out", type=Path, default=None, help="write the result dict as JSON here")
    return parser


@contextlib.contextmanager
def collector_off():
    """The load generator's garbage collector off while a hold is measured. What the clients hold
    (sockets, their parsers, the figures recorded) lives for the whole window, so a collection
    frees next to nothing, yet each holds the generator's loop for tens to hundreds of ms: a late
    reading of every request in flight, charged to the server. Measured on 8,192 ORS sessions: a
    400-800 ms "stall" every 35 s that was the generator's own. Freed again when the window ends."""
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.unfreeze()


def install_fast_loop() -> None:
    """uvloop when available: the client shares the CPU with the server, so its overhead matters."""
    try:
        import uvloop
    except ImportError:
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    install_fast_loop()
    try:
        result = asyncio.run(
            run_load(
                base_url=args.base_url,
                env=args.env,
                concurrency=args.concurrency,
                duration=args.duration,
                warmup=args.warmup,
                api_key=args.api_key,
                task_mode=args.task_mode,
                answer=args.answer,
            )
        )
    except (aiohttp.ClientError, TimeoutError, RuntimeError, ValueError) as exc:
        print(f"loadgen: could not run: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    print(format_table(result))
    if args.json_out:
        args.json_out.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if is_clean(result) else 1


def is_clean(result: dict[str, Any]) -> bool:
    """No errors at all and at least one episode (a hung server yields neither errors nor episodes)."""
    return result["episodes"] > 0 and not result["errors"] and not result["warmup_errors"]


if __name__ == "__main__":
    sys.exit(main())
