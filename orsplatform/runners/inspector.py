"""Inspect an environment package in a separate process: tools, splits, tasks and a sample prompt.

Run as::

    python -m orsplatform.runners.inspector PACKAGE_DIR ENTRYPOINT WORK_DIR [SAMPLE_JSON]

ENTRYPOINT is ``module:Class``, or empty to find the one ``ors.Environment`` subclass of the package
(``env.py`` first, then the other top-level modules). The report, a JSON object
``{ok, check, error, traceback, entrypoint, tools, splits, task_counts}``, is written to
``WORK_DIR/report.json`` before every check, so a process that dies still tells which check it was in.
Tasks listed by the class go to ``WORK_DIR/tasks/<n>.jsonl`` (n: the split's position), one spec a line.
SAMPLE_JSON is a task to render a prompt for when the class lists none (the package's task files).

Imports no Django, so tenant code never runs next to the platform's settings or database connections.
Resource limits come from the environment (``ORS_INSPECT_MEMORY_BYTES``, ``ORS_INSPECT_FILE_BYTES``)
and are applied to this process before any tenant code is imported.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import os
import re
import resource
import signal
import sys
import traceback
from pathlib import Path

REQUIREMENT_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
# Freed when tenant code runs out of memory, so the report can still be written.
_reserve: bytearray | None = None


async def _maybe(value):
    return await value if inspect.isawaitable(value) else value


def _write_report(work: Path, report: dict) -> None:
    tmp = work / "report.json.tmp"
    tmp.write_text(json.dumps(report, default=str))
    tmp.replace(work / "report.json")


def _apply_limits() -> None:
    memory = int(os.environ.get("ORS_INSPECT_MEMORY_BYTES", "0") or 0)
    fsize = int(os.environ.get("ORS_INSPECT_FILE_BYTES", "0") or 0)
    if memory > 0:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    if fsize > 0:
        # Past the limit a write fails with EFBIG instead of the process dying of SIGXFSZ.
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _split(value) -> dict:
    from ors import Split

    if isinstance(value, Split):
        return {"name": value.name, "type": value.type}
    if isinstance(value, str):
        return {"name": value, "type": value if value in ("train", "validation", "test") else "validation"}
    raise TypeError(f"list_splits() returned {value!r}; expected str or ors.Split")


def _check_requirements(requirements: list) -> None:
    """The platform does not install packages: every requirement must already be importable here."""
    from importlib import metadata

    missing = []
    for requirement in requirements:
        match = REQUIREMENT_NAME.match(str(requirement))
        if match is None:
            raise ValueError(f"Requirement {requirement!r} is not a package name.")
        try:
            installed = metadata.version(match.group(1))
        except metadata.PackageNotFoundError:
            missing.append(str(requirement))
            continue
        try:
            from packaging.requirements import Requirement
        except ImportError:  # no packaging: the name is all we can check
            continue
        if installed not in Requirement(str(requirement)).specifier:
            missing.append(f"{requirement} (installed: {installed})")
    if missing:
        raise ValueError("Requirements not available on this platform: " + ", ".join(missing))


def _check_schema(tool: dict) -> None:
    name = tool.get("name")
    if not isinstance(name, str) or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name):
        raise ValueError(f"Tool name {name!r} is not an identifier.")
    schema = tool.get("input_schema")
    if schema is None:
        return
    if not isinstance(schema, dict):
        raise ValueError(f"Tool {name!r}: input_schema must be a JSON object, got {type(schema).__name__}.")
    if schema.get("type", "object") != "object":
        raise ValueError(f"Tool {name!r}: input_schema must describe an object (type 'object').")
    properties = schema.get("properties", {})
    if not isinstance(properties, dict) or not all(isinstance(v, (dict, bool)) for v in properties.values()):
        raise ValueError(f"Tool {name!r}: input_schema.properties must map names to schemas.")
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise ValueError(f"Tool {name!r}: input_schema.required must be a list of names.")
    json.dumps(schema)  # must survive the wire


def _candidates(package_dir: str, module_name: str) -> list[str]:
    from ors import Environment

    from orsplatform.runners.loader import package_module_name

    pkg = package_module_name(package_dir)
    module = importlib.import_module(f"{pkg}.{module_name}")
    classes = [(attr, value) for attr, value in vars(module).items()
               if isinstance(value, type) and issubclass(value, Environment) and value is not Environment
               and value.__module__ == module.__name__]
    # Abstract helper bases are skipped when a concrete class is there to serve.
    concrete = [(attr, value) for attr, value in classes if not inspect.isabstract(value)]
    return [f"{module_name}:{attr}" for attr, _ in (concrete or classes)]


def discover_entrypoint(package_dir: str) -> str:
    """The package's one concrete Environment subclass, looked for in env.py, then other modules."""
    root = Path(package_dir)
    _register_package(package_dir)
    modules = [p.stem for p in sorted(root.glob("*.py")) if p.stem.isidentifier()]
    if "env" in modules:
        found = _candidates(package_dir, "env")
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            raise ValueError(f"Several Environment classes in env.py ({', '.join(found)}); "
                             "name one with entrypoint = 'module:Class' in manifest.toml.")
    found = [c for m in modules if m != "env" for c in _candidates(package_dir, m)]
    if len(found) == 1:
        return found[0]
    if not found:
        raise ValueError("No ors.Environment subclass found in the package's top-level modules.")
    raise ValueError(f"Several Environment classes ({', '.join(found)}); "
                     "name one with entrypoint = 'module:Class' in manifest.toml.")


def _register_package(package_dir: str) -> None:
    import types

    from orsplatform.runners.loader import package_module_name

    name = package_module_name(package_dir)
    if name not in sys.modules:
        pkg = types.ModuleType(name)
        pkg.__path__ = [str(Path(package_dir).resolve())]
        sys.modules[name] = pkg


def _lists_tasks(cls) -> bool:
    from ors import Environment

    return (getattr(cls.num_tasks, "__func__", None) is not Environment.num_tasks.__func__
            and getattr(cls.get_task, "__func__", None) is not Environment.get_task.__func__)


async def _class_tasks(cls, split: str):
    """An async iterator over the class's tasks of one split; None when the class lists none itself."""
    try:
        listed = await _maybe(cls.list_tasks(split))
    except NotImplementedError:
        if not _lists_tasks(cls):
            return None
        total = await _maybe(cls.num_tasks(split))

        async def by_index():
            for i in range(total):
                yield await _maybe(cls.get_task(split, i))

        return by_index()
    if listed is None:
        return None

    async def from_list():
        for spec in listed:
            yield spec

    return from_list()


async def _write_tasks(cls, split: str, out_path: Path) -> int | None:
    tasks = await _class_tasks(cls, split)
    if tasks is None:
        return None
    count = 0
    with out_path.open("w", encoding="utf-8") as out:
        async for spec in tasks:
            if not isinstance(spec, dict):
                raise TypeError(f"Task {count} of split {split!r} is {type(spec).__name__}, not a JSON object.")
            out.write(json.dumps(spec) + "\n")
            count += 1
    return count


async def inspect_package(package_dir: str, entrypoint: str, work: Path, sample: dict | None,
                          report: dict) -> dict:
    from orsplatform.runners.loader import load_environment_class

    def stage(check: str) -> None:
        report["check"] = check
        _write_report(work, report)

    stage("requirements")
    manifest_path = Path(package_dir) / "manifest.toml"
    if manifest_path.exists():
        import tomllib

        _check_requirements(list(tomllib.loads(manifest_path.read_text(encoding="utf-8")).get("requirements", [])))
    stage("import")
    if not entrypoint:
        entrypoint = discover_entrypoint(package_dir)
    report["entrypoint"] = entrypoint
    cls = load_environment_class(package_dir, entrypoint)
    stage("tools")
    tools = [t.model_dump() for t in cls.list_tools().tools]
    if not tools:
        raise ValueError("The environment defines no @tool methods.")
    stage("schemas")
    for tool in tools:
        _check_schema(tool)
    stage("splits")
    splits = [_split(s) for s in cls.list_splits()]
    if not splits:
        raise ValueError("list_splits() returned no splits.")
    names = [s["name"] for s in splits]
    if len(set(names)) != len(names):
        raise ValueError(f"list_splits() names a split twice: {names}")
    stage("tasks")
    counts: dict[str, int | None] = {}
    tasks_dir = work / "tasks"
    tasks_dir.mkdir(exist_ok=True)
    for position, split in enumerate(splits):
        path = tasks_dir / f"{position}.jsonl"
        counts[split["name"]] = await _write_tasks(cls, split["name"], path)
        if sample is None and counts[split["name"]]:
            with path.open(encoding="utf-8") as fh:
                sample = json.loads(fh.readline())
    report.update(tools=tools, splits=splits, task_counts=counts, prompt_checked=False)
    if sample is not None:
        stage("prompt")
        env = cls(task_spec=sample, secrets={})
        await _maybe(env.setup())
        blocks = await _maybe(env.get_prompt())
        if not blocks:
            raise ValueError("get_prompt() returned no blocks for a sample task.")
        await _maybe(env.teardown())
        report["prompt_checked"] = True
    report.update(ok=True, check="done", class_name=cls.__name__)
    return report


def main() -> int:
    global _reserve
    package_dir, entrypoint, work_dir = sys.argv[1:4]
    work = Path(work_dir)
    sample = json.loads(Path(sys.argv[4]).read_text()) if len(sys.argv) > 4 else None
    _apply_limits()
    _reserve = bytearray(16 * 1024 * 1024)
    report: dict = {"ok": False, "check": "start"}
    try:
        report = asyncio.run(inspect_package(package_dir, entrypoint, work, sample, report))
    except BaseException as exc:  # tenant code may raise anything, SystemExit included
        _reserve = None
        if isinstance(exc, MemoryError):
            limit = int(os.environ.get("ORS_INSPECT_MEMORY_BYTES", "0") or 0) // (1024 * 1024)
            error = f"MemoryError: the package exceeded the validation memory limit ({limit} MiB)."
        else:
            error = f"{type(exc).__name__}: {exc}"
        tb = traceback.format_exc()
        del exc
        report.update(ok=False, error=error, traceback=tb[-20000:])
    _write_report(work, report)
    return 0 if report.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
