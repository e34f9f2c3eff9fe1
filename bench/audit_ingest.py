"""Audit-log ingestion: tool-call rows/s sustained through the gateway's own writer on PostgreSQL,
against PostgreSQL's own COPY ceiling measured in the same run, and the kill -9 durability check.

    .venv/bin/python bench/audit_ingest.py [--duration 20] [--gateways 2] [--concurrency 512]

A fresh PostgreSQL database is created (and dropped afterwards) and migrated; a team, an
environment and 1,000 sessions are seeded. Then, on the same database and table:

1. ceiling: `psql \\copy` of --ceiling-rows rows of the same shape into episodes_toolcall (the
   server's COPY with nothing of the platform in the way), before and after the platform's run;
2. platform: --gateways processes, each a gateway's Store (engine/store.py: the group commit and
   the PostgreSQL writer, COPY for batches of calls), with --concurrency coroutines each recording
   one finished call at a time as a gateway does after a tool returns (`store.tool_call_record`),
   awaiting its commit before the next. Rows/s are those acknowledged, i.e. durable;
3. kill -9: one more gateway process prints each call id once its write was acknowledged; it is
   killed with SIGKILL mid-stream, and every id the bench read must be in the table.

Reported: the ceiling's rows/s, the platform's sustained rows/s and their ratio, and the kill check
(acknowledged ids read, found, lost). Exit status 0 when nothing acknowledged was lost and the
sustained rate meets --budget.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.compare import PG_ADMIN, platform_env, postgres_database  # noqa: E402

SESSIONS = 1000


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=20.0, help="measured seconds of the platform's run")
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--gateways", type=int, default=2, help="writer processes (gateways)")
    p.add_argument("--concurrency", type=int, default=512, help="calls in flight per gateway")
    p.add_argument("--ceiling-rows", type=int, default=200_000)
    p.add_argument("--kill-after", type=float, default=5.0, help="seconds of acknowledged writes before kill -9")
    p.add_argument("--budget", type=float, default=20_000.0, help="rows/s the platform must sustain")
    p.add_argument("--insert", action="store_true",
                   help="the gateways write by INSERT (the writer before COPY), for comparison")
    p.add_argument("--child", choices=["count", "acks"], help=argparse.SUPPRESS)
    p.add_argument("--seconds", type=float, default=0.0, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def setup_django(database_url: str) -> None:
    os.environ.update(platform_env(database_url))
    import django

    django.setup()


def seed() -> list[int]:
    from orsplatform.catalog.models import Environment, EnvironmentVersion
    from orsplatform.episodes.models import Session
    from orsplatform.teams.models import Team

    team = Team.objects.create(slug="ingest", name="Ingest")
    env = Environment.objects.create(team=team, slug="audit", visibility="private")
    version = EnvironmentVersion.objects.create(environment=env, number=1, content_hash="0" * 64,
                                                package_path="", entrypoint="env:Env", status="ready")
    now = datetime.now(UTC)
    sessions = Session.objects.bulk_create([
        Session(sid=f"ingest-{i}", team=team, environment=env, version=version, task_spec={"q": i},
                split="train", task_index=i, status="ready", created_at=now, last_activity_at=now)
        for i in range(SESSIONS)])
    return [s.pk for s in sessions]


def call(session_pk: int, step: int) -> dict:
    """A finished call as the gateway records it (calls.py): a short text result with a reward."""
    now = datetime.now(UTC)
    last = step % 5 == 4
    return {"session_pk": session_pk, "task_id": uuid.uuid4().hex, "name": "submit" if last else "move",
            "input": {"action": "up", "step": step},
            "result": {"ok": True, "output": {"blocks": [{"type": "text", "text": f"You moved up (step {step})."}],
                                              "metadata": None, "reward": 1.0 if last else 0.0, "finished": last}},
            "exception": "", "started_at": now, "finished_at": now}


# --- the ceiling ------------------------------------------------------------------------------------

def ceiling(database_url: str, session_pks: list[int], rows: int, workdir: Path) -> float:
    """rows/s of `psql \\copy` into episodes_toolcall: the same rows' text, made beforehand."""
    from orsplatform.episodes import services
    from orsplatform.episodes.hot_writes import copy_form
    from orsplatform.episodes.models import ToolCall

    rng = random.Random(7)
    form = copy_form(ToolCall, [services.tool_call_fields(call(rng.choice(session_pks), n)) for n in range(rows)])
    path = workdir / "rows.tsv"
    path.write_bytes(form.data)
    columns = form.sql[form.sql.index("("):form.sql.index(")") + 1]
    name = database_url.rsplit("/", 1)[1]
    started = time.perf_counter()
    subprocess.run(["psql", *PG_ADMIN, "-q", "-d", name, "-c", f"\\copy episodes_toolcall {columns} FROM '{path}'"],
                   check=True)
    return rows / (time.perf_counter() - started)


# --- the gateways -----------------------------------------------------------------------------------

async def gateway(mode: str, seconds: float, session_pks: list[int]) -> None:
    """A gateway's Store recording calls from `concurrency` coroutines until `seconds` have passed.
    Prints `count N` each 0.25 s (mode count) or each acknowledged call id (mode acks)."""
    from orsplatform.engine.store import Store

    args = parse_args(sys.argv[1:])
    if args.insert:
        from orsplatform.engine import pg_writer

        pg_writer.COPY_MIN_ROWS = 10**9
    store = Store(threads=2)
    deadline = time.monotonic() + seconds
    done = 0
    out = sys.stdout

    async def one(k: int) -> None:
        nonlocal done
        rng = random.Random(k)
        step = 0
        while time.monotonic() < deadline:
            row = call(rng.choice(session_pks), step)
            await store.tool_call_record(**row)
            done += 1
            step += 1
            if mode == "acks":
                out.write(row["task_id"] + "\n")

    async def report() -> None:
        while time.monotonic() < deadline:
            await asyncio.sleep(0.25 if mode == "count" else 0.02)
            if mode == "count":
                out.write(f"count {done}\n")
            out.flush()

    try:
        await asyncio.gather(report(), *[one(k) for k in range(args.concurrency)])
        out.write(f"count {done}\n")
        out.flush()
    finally:
        await store.aclose()
        store.close()


def child_command(args: argparse.Namespace, mode: str, seconds: float) -> list[str]:
    return [sys.executable, __file__, "--child", mode, "--seconds", str(seconds),
            "--concurrency", str(args.concurrency), *(["--insert"] if args.insert else [])]


def run_gateways(args: argparse.Namespace, env: dict[str, str]) -> dict:
    """Sustained acknowledged rows/s over the measured window, from the children's running counts."""
    seconds = args.warmup + args.duration
    procs = [subprocess.Popen(child_command(args, "count", seconds + 1), env=env, stdout=subprocess.PIPE,
                              text=True) for _ in range(args.gateways)]
    counts = [0] * len(procs)
    marks: dict[str, tuple[float, int]] = {}
    import selectors

    sel = selectors.DefaultSelector()
    for i, proc in enumerate(procs):
        sel.register(proc.stdout, selectors.EVENT_READ, i)
    started = time.monotonic()
    open_streams = len(procs)
    while open_streams:
        for key, _ in sel.select(timeout=1.0):
            line = key.fileobj.readline()
            if not line:
                sel.unregister(key.fileobj)
                open_streams -= 1
                continue
            if line.startswith("count "):
                counts[key.data] = int(line.split()[1])
        elapsed = time.monotonic() - started
        if "start" not in marks and elapsed >= args.warmup:
            marks["start"] = (time.monotonic(), sum(counts))
        if "end" not in marks and elapsed >= seconds:
            marks["end"] = (time.monotonic(), sum(counts))
    for proc in procs:
        proc.wait(timeout=60)
    (t0, c0), (t1, c1) = marks["start"], marks.get("end", (time.monotonic(), sum(counts)))
    return {"rows": c1 - c0, "seconds": t1 - t0, "rows_per_s": (c1 - c0) / (t1 - t0), "total": sum(counts)}


def kill_check(args: argparse.Namespace, env: dict[str, str]) -> dict:
    """kill -9 a gateway mid-stream; every call id it printed (acknowledged) must be stored."""
    from orsplatform.episodes.models import ToolCall

    proc = subprocess.Popen(child_command(args, "acks", args.kill_after + 30), env=env, stdout=subprocess.PIPE,
                            text=True)
    acked: list[str] = []
    started = time.monotonic()
    while time.monotonic() - started < args.kill_after:
        line = proc.stdout.readline()
        if not line:
            break
        if not line.startswith("count "):
            acked.append(line.strip())
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    # What was already in the pipe was acknowledged before the kill too.
    acked.extend(line.strip() for line in proc.stdout.read().splitlines() if line and not line.startswith("count "))
    found = 0
    for start in range(0, len(acked), 5000):
        found += ToolCall.objects.filter(task_id__in=acked[start:start + 5000]).count()
    return {"acknowledged": len(acked), "found": found, "lost": len(acked) - found}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        setup_django(os.environ["DATABASE_URL"])
        pks = json.loads(os.environ["ORS_BENCH_SESSIONS"])
        asyncio.run(gateway(args.child, args.seconds, pks))
        return 0
    with postgres_database() as database_url, tempfile.TemporaryDirectory() as tmp:
        setup_django(database_url)
        from django.core.management import call_command

        call_command("migrate", verbosity=0, interactive=False)
        pks = seed()
        env = {**platform_env(database_url), "ORS_BENCH_SESSIONS": json.dumps(pks)}
        before = ceiling(database_url, pks, args.ceiling_rows, Path(tmp))
        print(f"ceiling (psql \\copy, before): {before:,.0f} rows/s", flush=True)
        platform = run_gateways(args, env)
        print(f"platform ({'INSERT' if args.insert else 'COPY'}, {args.gateways} gateways x {args.concurrency} in flight): "
              f"{platform['rows_per_s']:,.0f} rows/s acknowledged over {platform['seconds']:.1f} s", flush=True)
        after = ceiling(database_url, pks, args.ceiling_rows, Path(tmp))
        print(f"ceiling (psql \\copy, after): {after:,.0f} rows/s", flush=True)
        reference = (before + after) / 2
        kill = kill_check(args, env)
        result = {"ceiling_rows_per_s": round(reference), "ceiling_before": round(before),
                  "ceiling_after": round(after), "platform_rows_per_s": round(platform["rows_per_s"]),
                  "ratio": round(platform["rows_per_s"] / reference, 3), "kill_9": kill,
                  "load_average": os.getloadavg()}
        print(json.dumps(result, indent=2))
        return 0 if kill["lost"] == 0 and platform["rows_per_s"] >= args.budget else 1


if __name__ == "__main__":
    sys.exit(main())
