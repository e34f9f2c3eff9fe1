"""Rollout API ingestion: messages/s sustained through POST /v1/rollouts on PostgreSQL, and the
server's memory over time. Budget (issue #26): >= 2,000 messages/s sustained with flat memory.

    .venv/bin/python bench/rollout_ingest.py [--duration 60] [--uploaders 16] [--server uvicorn]

A fresh PostgreSQL database is created (and dropped afterwards), migrated, and a team key minted;
the platform runs as `make run` starts it. Load is the openreward client's wire format, built with
the client's own event classes and encoder (openreward.models, openreward.api.rollouts.background):
each uploader starts a rollout (one POST, as `rollout.create` does), then posts its messages in
batches of 128 events (the client's max_batch_items), the last one with a reward and isFinished,
and loops. Uploaders run concurrently (the client uploads up to 32 batches at once). Reported per
window: messages acknowledged per second, batch p50/p99 latency, and the server's RSS (its process
tree). Exit status 0 when the sustained rate meets --budget and no batch failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from pathlib import Path

import aiohttp
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.compare import (  # noqa: E402
    free_port,
    manage,
    platform_command,
    platform_env,
    postgres_database,
    server_process,
    tree_cpu_seconds,
)

BATCH = 128  # the client's max_batch_items
MINT_KEY = (
    "from orsplatform.teams.services import team_create, api_key_create;"
    "t = team_create(slug='benchruns', name='Bench runs');"
    "print(api_key_create(team=t, name='trainer', scopes=['sessions']).token)"
)


def encode(event) -> dict:
    from openreward.api.rollouts.background import _encode_event

    return json.loads(_encode_event(event))


def started_event(run: str, step: int) -> dict:
    from openreward.models import RolloutConfig, RolloutStartedEvent

    config = RolloutConfig(run_name=run, environment="benchruns/none", split="train",
                           task_spec={"question": "1+1", "id": step},
                           run_info={"model_name": "bench-model", "rl_algorithm": "grpo", "initial_step": 0})
    return encode(RolloutStartedEvent.from_config(event_id=str(uuid.uuid4()), timestamp=int(time.time() * 1000),
                                                  config=config))


_templates: list[dict] = []


def message_events(rollout_id: str, start: int, count: int, last: bool, content: str) -> list[dict]:
    """The client's LogMessageEvents, encoded by its own encoder once per kind of message, then given
    fresh ids (so the load generator's CPU goes to sending, not to dataclasses.asdict)."""
    from openreward.models import LogMessageEvent

    kinds = ("user_message", "assistant_message", "tool_result", "reasoning")
    if not _templates:
        for kind in kinds:
            _templates.append(encode(LogMessageEvent(
                eventId="", timestamp=0, index=0, rolloutEventId="", type=kind,
                content=content if kind != "reasoning" else None,
                summary=content[:80] if kind == "reasoning" else None, isFinished=False, metadata={"turn": 0})))
    now = int(time.time() * 1000)
    out = []
    for i in range(start, start + count):
        event = {**_templates[i % len(kinds)], "eventId": str(uuid.uuid4()), "timestamp": now, "index": i,
                 "rolloutEventId": rollout_id, "metadata": {"turn": i}}
        if last and i == start + count - 1:
            event.update(reward=1.0, isFinished=True)
        out.append(event)
    return out


def rss_mb(pid: int) -> float:
    try:
        proc = psutil.Process(pid)
        return sum(p.memory_info().rss for p in [proc, *proc.children(recursive=True)]) / 2**20
    except psutil.NoSuchProcess:
        return float("nan")


async def run_load(base_url: str, token: str, *, uploaders: int, duration: float, warmup: float,
                   messages_per_rollout: int, content_bytes: int, window: float, server_pid: int) -> dict:
    started_event("warm-up", 0)  # imports the openreward package (seconds) before the clock starts
    content = ("The model thinks about the arithmetic and writes an answer. " * 64)[:content_bytes]
    headers = {"x-api-key": token, "Content-Type": "application/json"}
    acked: list[tuple[float, int]] = []  # (time, messages) per acknowledged batch
    latencies: list[tuple[float, float]] = []
    failures: list[str] = []
    t0 = time.monotonic()
    stop_at = t0 + warmup + duration

    async def post(session: aiohttp.ClientSession, events: list[dict]) -> None:
        started = time.monotonic()
        async with session.post("/v1/rollouts", data=json.dumps({"events": events}, separators=(",", ":")),
                                headers=headers) as resp:
            text = await resp.text()
            if resp.status != 200:
                failures.append(f"{resp.status} {text[:200]}")
                return
        done = time.monotonic()
        latencies.append((done, done - started))
        n = sum(1 for e in events if e["eventType"] == "message")
        if n:
            acked.append((done, n))

    async def uploader(n: int, session: aiohttp.ClientSession) -> None:
        step = 0
        while time.monotonic() < stop_at:
            rollout = started_event(f"bench-run-{n % 4}", step)
            await post(session, [rollout])
            for start in range(0, messages_per_rollout, BATCH):
                count = min(BATCH, messages_per_rollout - start)
                await post(session, message_events(rollout["eventId"], start, count,
                                                   start + count >= messages_per_rollout, content))
                if time.monotonic() >= stop_at:
                    break
            step += 1

    samples: list[tuple[float, float]] = []
    cpu_marks: list[float] = []

    async def mark_cpu() -> None:
        await asyncio.sleep(warmup)  # the measured part starts after the warm-up
        cpu_marks.append(tree_cpu_seconds(server_pid))

    async def sample_memory() -> None:
        while time.monotonic() < stop_at:
            samples.append((time.monotonic() - t0, rss_mb(server_pid)))
            await asyncio.sleep(window)  # sampling period, not a wait on a condition

    connector = aiohttp.TCPConnector(limit=uploaders)
    async with aiohttp.ClientSession(base_url=base_url, connector=connector) as session:
        await asyncio.gather(sample_memory(), mark_cpu(), *(uploader(n, session) for n in range(uploaders)))
    cpu = tree_cpu_seconds(server_pid) - cpu_marks[0]
    samples.append((time.monotonic() - t0, rss_mb(server_pid)))

    measured_from = t0 + warmup
    windows = []
    edge = measured_from
    while edge + window <= stop_at + 1e-6:
        msgs = sum(n for t, n in acked if edge <= t < edge + window)
        lats = sorted(lat for t, lat in latencies if edge <= t < edge + window)
        rss = [m for t, m in samples if edge - t0 <= t < edge - t0 + window]
        windows.append({"t": round(edge - t0, 1), "messages_per_s": msgs / window,
                        "p50_ms": 1000 * lats[len(lats) // 2] if lats else None,
                        "p99_ms": 1000 * lats[min(len(lats) - 1, int(len(lats) * 0.99))] if lats else None,
                        "rss_mb": rss[0] if rss else None})
        edge += window
    total = sum(n for t, n in acked if measured_from <= t < stop_at)
    return {"messages_per_s": total / duration, "messages": total,
            "server_cpu_ms_per_1000_messages": 1000 * cpu * 1000 / max(total, 1), "failures": failures[:5],
            "failed_batches": len(failures), "windows": windows,
            "rss_first_mb": samples[0][1] if samples else None,
            "rss_after_warmup_mb": next((m for t, m in samples if t >= warmup), None),
            "rss_last_mb": samples[-1][1] if samples else None,
            "min_window_messages_per_s": min((w["messages_per_s"] for w in windows), default=0.0)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=60.0, help="measured seconds")
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--uploaders", type=int, default=16, help="concurrent batch uploads (the client: up to 32)")
    parser.add_argument("--messages-per-rollout", type=int, default=256)
    parser.add_argument("--content-bytes", type=int, default=400, help="characters of each message")
    parser.add_argument("--window", type=float, default=10.0, help="seconds per reported window")
    parser.add_argument("--server", choices=["uvicorn", "daphne"], default="uvicorn")
    parser.add_argument("--budget", type=float, default=2000.0, help="messages/s the run must sustain")
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args(argv)

    workdir = Path(os.environ.get("TMPDIR", "/tmp"))
    with postgres_database() as database_url:
        env = {**platform_env(database_url), "OPENREWARD_DISABLE_UPDATE_CHECK": "1"}
        manage(["migrate", "--noinput"], env)
        token = manage(["shell", "-c", MINT_KEY], env, timeout=60).strip().splitlines()[-1]
        port = free_port()
        base_url = f"http://127.0.0.1:{port}"
        log = workdir / f"rollout-ingest-{port}.log"
        with server_process("platform", platform_command(args.server, port), env, base_url, log, 60.0) as proc:
            print(f"-- {args.warmup:g}s warm-up + {args.duration:g}s, {args.uploaders} uploaders, "
                  f"{args.messages_per_rollout} messages/rollout, {args.content_bytes} chars each, {args.server}",
                  flush=True)
            result = asyncio.run(run_load(
                base_url, token, uploaders=args.uploaders, duration=args.duration, warmup=args.warmup,
                messages_per_rollout=args.messages_per_rollout, content_bytes=args.content_bytes,
                window=args.window, server_pid=proc.pid))
    print(f"{'t (s)':>6} {'msg/s':>8} {'p50 ms':>7} {'p99 ms':>7} {'RSS MB':>7}")
    for w in result["windows"]:
        fmt = lambda v, spec: format(v, spec) if v is not None else "-"  # noqa: E731
        print(f"{w['t']:>6} {w['messages_per_s']:>8.0f} {fmt(w['p50_ms'], '>7.1f')} {fmt(w['p99_ms'], '>7.1f')} "
              f"{fmt(w['rss_mb'], '>7.1f')}")
    print(f"sustained {result['messages_per_s']:.0f} messages/s ({result['messages']} messages), lowest window "
          f"{result['min_window_messages_per_s']:.0f}/s; failed batches {result['failed_batches']}; server RSS "
          f"{result['rss_after_warmup_mb']:.1f} MB after warm-up -> {result['rss_last_mb']:.1f} MB at the end; "
          f"server CPU {result['server_cpu_ms_per_1000_messages']:.0f} ms per 1,000 messages; "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if result["failures"]:
        print("failures:", *result["failures"], sep="\n  ")
    if args.json_out:
        args.json_out.write_text(json.dumps(result, indent=2))
    ok = result["messages_per_s"] >= args.budget and not result["failed_batches"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
