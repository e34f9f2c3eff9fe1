"""The audit writer's own CPU per acknowledged row: one gateway's Store in this process, the calls'
rows made before the clock starts (so the load generator's row making is not counted).

    .venv/bin/python bench/audit_writer_cpu.py [--seconds 6] [--concurrency 512] [--profile]

A fresh PostgreSQL database is created, migrated and seeded as bench/audit_ingest.py does; then
--concurrency coroutines each await `store.tool_call_record` one call at a time. Reported: the rows
acknowledged, rows/s, and this process's CPU seconds (time.process_time) per row; --profile prints
cProfile's top functions as well.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import audit_ingest  # noqa: E402
from bench.compare import postgres_database  # noqa: E402


async def measure(rows: list[dict], seconds: float, concurrency: int, profile: bool) -> None:
    from orsplatform.engine.store import Store

    store = Store(threads=2)
    await store.tool_call_record(**rows[0])  # connections opened before the clock starts
    pending = iter(rows[1:])
    done = 0
    deadline = time.monotonic() + seconds

    async def one() -> None:
        nonlocal done
        for row in pending:
            if time.monotonic() >= deadline:
                return
            await store.tool_call_record(**row)
            done += 1

    profiler = cProfile.Profile() if profile else None
    cpu, wall = time.process_time(), time.monotonic()
    if profiler:
        profiler.enable()
    try:
        await asyncio.gather(*[one() for _ in range(concurrency)])
    finally:
        if profiler:
            profiler.disable()
        cpu, wall = time.process_time() - cpu, time.monotonic() - wall
        await store.aclose()
        store.close()
    print(f"{done:,} rows acknowledged in {wall:.1f} s: {done / wall:,.0f} rows/s, "
          f"{cpu / max(done, 1) * 1e6:.1f} µs of this process's CPU a row (cProfile on: {profile})")
    if profiler:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=6.0)
    p.add_argument("--concurrency", type=int, default=512)
    p.add_argument("--rows", type=int, default=200_000, help="rows made beforehand (the most it can record)")
    p.add_argument("--profile", action="store_true")
    args = p.parse_args(argv)
    with postgres_database() as database_url:
        audit_ingest.setup_django(database_url)
        from django.core.management import call_command
        from django.db import connection

        call_command("migrate", verbosity=0, interactive=False)
        pks = audit_ingest.seed()
        connection.close()
        rng = random.Random(1)
        rows = [audit_ingest.call(rng.choice(pks), n) for n in range(args.rows)]
        asyncio.run(measure(rows, args.seconds, args.concurrency, args.profile))
    return 0


if __name__ == "__main__":
    sys.exit(main())
