"""Inspect an environment package in a separate process: tools, splits, tasks and a sample prompt.

Run as ``python -m orsplatform.runners.inspector PACKAGE_DIR ENTRYPOINT TASKS_OUT``. Prints one JSON
object on stdout; writes tasks as JSON lines ``{"split": ..., "spec": ...}`` to TASKS_OUT. Imports no
Django, so tenant code never runs next to the platform's settings or database connections.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import sys
import traceback

from ors import Environment, Split


async def _maybe(value):
    return await value if inspect.isawaitable(value) else value


def _split(value) -> dict:
    if isinstance(value, Split):
        return {"name": value.name, "type": value.type}
    if isinstance(value, str):
        return {"name": value, "type": value if value in ("train", "validation", "test") else "validation"}
    raise TypeError(f"list_splits() returned {value!r}; expected str or ors.Split")


async def _tasks(cls: type[Environment], split: str) -> list:
    try:
        return list(await _maybe(cls.list_tasks(split)))
    except NotImplementedError:
        total = await cls.num_tasks(split)
        return [await cls.get_task(split, i) for i in range(total)]


async def inspect_package(package_dir: str, entrypoint: str, tasks_out: str, report: dict) -> dict:
    from orsplatform.runners.loader import load_environment_class

    report["check"] = "import"
    cls = load_environment_class(package_dir, entrypoint)
    report["check"] = "tools"
    tools = [t.model_dump() for t in cls.list_tools().tools]
    if not tools:
        raise ValueError("The environment defines no @tool methods.")
    report["check"] = "splits"
    splits = [_split(s) for s in cls.list_splits()]
    if not splits:
        raise ValueError("list_splits() returned no splits.")
    report["check"] = "tasks"
    counts: dict[str, int] = {}
    sample = None
    with open(tasks_out, "w", encoding="utf-8") as out:
        for split in splits:
            tasks = await _tasks(cls, split["name"])
            counts[split["name"]] = len(tasks)
            for spec in tasks:
                if sample is None:
                    sample = spec
                out.write(json.dumps({"split": split["name"], "spec": spec}) + "\n")
    if sample is not None:
        report["check"] = "prompt"
        env = cls(task_spec=sample, secrets={})
        await _maybe(env.setup())
        blocks = await _maybe(env.get_prompt())
        if not blocks:
            raise ValueError("get_prompt() returned no blocks for a sample task.")
        await _maybe(env.teardown())
    return {"ok": True, "class_name": cls.__name__, "tools": tools, "splits": splits, "task_counts": counts}


def main() -> int:
    package_dir, entrypoint, tasks_out = sys.argv[1:4]
    report: dict = {"ok": False, "check": "import"}
    try:
        report = asyncio.run(inspect_package(package_dir, entrypoint, tasks_out, report))
    except BaseException as exc:  # tenant code may raise anything, SystemExit included
        report.update(error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
    sys.stdout.write("\n" + json.dumps(report) + "\n")
    return 0 if report.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
