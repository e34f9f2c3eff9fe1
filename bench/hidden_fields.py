"""The per-request cost of hidden task fields (docs/hidden-tasks.md), in the gateway's own code:

    cd /work/main && .venv/bin/python bench/hidden_fields.py [--tasks 1000] [--rounds 200000]

- filter: EpisodeGateway.task_public (a task read: the cached spec, redacted by the split's
  precomputed key set) against the same read on a split without hidden fields;
- rehydration: Store.task_match for a task object a client sent back (digest of the redacted
  canonical JSON, the gateway's digest -> index cache, the stored spec confirmed), warm, as every
  /create after a task's first one; the first one adds one indexed lookup on a DB thread.

Both run on the real gateway and store objects with their caches filled the way a warm gateway has
them (no database is touched in the timed loops), one coroutine after another on one event loop:
the figures are CPU time per request, which is what concurrency 16 multiplies. The end-to-end
ratio with hidden fields on is bench/compare.py --hide-fields answer (see bench/README.md).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "orsplatform.settings")
os.environ.setdefault("DATABASE_URL", "sqlite:///:memory:")


def math_task(i: int) -> dict:
    return {"id": f"train-{i}", "question": f"What is {i} + {i * 7 % 13}? Answer with the number only.",
            "answer": str(i + i * 7 % 13), "difficulty": "easy", "topic": "arithmetic"}


async def per_call_us(fn, rounds: int) -> float:
    start = time.process_time()
    for _ in range(rounds):
        await fn()
    return (time.process_time() - start) / rounds * 1e6


async def main(tasks: int, rounds: int) -> None:
    import django

    django.setup()
    from orsplatform.catalog.hidden import digest, redact
    from orsplatform.catalog.selectors import EnvHandle, SplitInfo
    from orsplatform.engine.gateway import EpisodeGateway
    from orsplatform.engine.store import Store
    from orsplatform.executors.inline import InlineExecutor

    hidden = frozenset({"answer"})
    open_split = SplitInfo(1, "open", "train", tasks, 1)
    hiding = SplitInfo(2, "train", "train", tasks, 1, hidden, False)
    sealed = SplitInfo(3, "test", "test", tasks, 1, hidden, True)
    env = EnvHandle(environment_id=1, team_id=1, team_slug="builtin", slug="math", visibility="public", version_id=1,
                    version_number=1, package_path="", entrypoint="env:Math", tools=[], tool_timeout=60.0,
                    splits={"train": hiding, "test": sealed}, split_order=("train", "test"))
    store = Store(threads=1)
    gw = EpisodeGateway(executor=InlineExecutor(threads=1), store=store)

    for split in (open_split, hiding, sealed):
        for i in range(tasks):
            store._tasks[(split.id, split.revision, i)] = math_task(i)
            if split.hidden:
                store._digests[(split.id, split.revision, digest(math_task(i), split.hidden))] = i
    sent = [redact(math_task(i), hidden) for i in range(tasks)]  # what clients send back
    n = iter(range(10**12))

    async def read_open():
        await gw.task_public(open_split, next(n) % tasks)

    async def read_hidden():
        await gw.task_public(hiding, next(n) % tasks)

    async def rehydrate():
        match = await store.task_match(env, sent[next(n) % tasks])
        assert match is not None

    base = await per_call_us(read_open, rounds)
    filtered = await per_call_us(read_hidden, rounds)
    rehydration = await per_call_us(rehydrate, rounds)
    block = [store._tasks[(2, 1, i)] for i in range(100)]
    start = time.process_time()
    for _ in range(rounds // 100):
        [redact(spec, hidden) for spec in block]  # what EpisodeGateway.tasks_public adds to a read
    redact_100 = (time.process_time() - start) / max(1, rounds // 100) * 1e6
    print(f"task read, split without hidden fields: {base:.2f} us/request")
    print(f"task read, split hiding 'answer':      {filtered:.2f} us/request (filter: {filtered - base:+.2f} us)")
    print(f"task_range of 100 tasks, the filter:   {redact_100:.2f} us/request")
    print(f"rehydration of a task object (warm, two hiding splits): {rehydration:.2f} us/request")
    budget = 100.0
    worst = max(filtered - base, redact_100, rehydration)
    print(f"budget 100 us per request: {'kept' if worst < budget else 'EXCEEDED'} (worst {worst:.2f} us)")
    store.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=200_000)
    args = parser.parse_args()
    asyncio.run(main(args.tasks, args.rounds))
