"""Inspect an environment package in a separate process: tools, splits, tasks and a sample prompt.

Run as::

    python -m orsplatform.sandbox.inspector PACKAGE_DIR ENTRYPOINT < REQUEST_JSON

(REQUEST_JSON ``{"rows": [{"row", "line", "spec"}, ...]}`` instead runs an upload's sampled task rows
through setup() and get_prompt(): `check_rows`.)

ENTRYPOINT is ``module:Class``, or empty to find the one ``ors.Environment`` subclass of the package
(``env.py`` first, then the other top-level modules). REQUEST_JSON, on stdin, is ``{"sample": task}``
with a task to render a prompt for when the class lists none (the package's task files), or ``{}``.

Results go back on stdout, one record a line (executors/inspection.py reads them): the report, a JSON
object ``{ok, check, error, traceback, entrypoint, tools, splits, task_counts}``, as ``R <json>``
before every check, so a process that dies still tells which check it was in; each task the class
lists as ``T<n> <json>`` (n: the split's position). Nothing is written to a file: the platform
writes what it keeps. What tenant code prints to stdout goes to stderr, so it cannot mix with them.

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


class Channel:
    """The result pipe: the process's original stdout, moved to a descriptor of its own (not
    inherited by what tenant code starts); stdout itself then points at stderr."""

    def __init__(self) -> None:
        self.out = os.fdopen(os.dup(1), "wb", buffering=1024 * 1024)
        os.dup2(2, 1)

    def report(self, report: dict) -> None:
        self.out.write(b"R " + json.dumps(report, default=str).encode() + b"\n")
        self.out.flush()

    def task(self, position: int, spec: dict) -> None:
        # json.dumps escapes newlines inside strings: one task is one line.
        self.out.write(b"T%d " % position + json.dumps(spec).encode() + b"\n")


def _limit(kind: int, value: int) -> None:
    """Sets the limit, never above the one the sandbox already imposes (which may be lower)."""
    hard = resource.getrlimit(kind)[1]
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    resource.setrlimit(kind, (value, value))


def _apply_limits() -> None:
    memory = int(os.environ.get("ORS_INSPECT_MEMORY_BYTES", "0") or 0)
    fsize = int(os.environ.get("ORS_INSPECT_FILE_BYTES", "0") or 0)
    if memory > 0:
        _limit(resource.RLIMIT_AS, memory)
    if fsize > 0:
        # Past the limit a write fails with EFBIG instead of the process dying of SIGXFSZ.
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        _limit(resource.RLIMIT_FSIZE, fsize)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _split(value) -> dict:
    # ors.Split and openreward.environments.Split: the same model in two SDKs.
    if type(value).__name__ == "Split" and isinstance(getattr(value, "name", None), str):
        return {"name": value.name, "type": value.type}
    if isinstance(value, str):
        return {"name": value, "type": value if value in ("train", "validation", "test") else "validation"}
    raise TypeError(f"list_splits() returned {value!r}; expected str or Split")


def _check_requirements(requirements: list) -> None:
    """The platform does not install packages: every requirement must already be importable here."""
    from importlib import metadata

    missing = []
    for requirement in requirements:
        match = REQUIREMENT_NAME.match(str(requirement))
        if match is None:
            raise ValueError(f"Requirement {requirement!r} is not a package name.")
        name = match.group(1)
        if name.lower().replace("_", "-") == "openenv-core":
            # OpenEnv's old distribution name, built as openenv (catalog/requirements.py)
            name, requirement = "openenv", "openenv"
        try:
            installed = metadata.version(name)
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


# Modules that are never the environment (importing them would run tooling, not the package).
NOT_SCANNED = {"setup", "conftest", "noxfile", "fabfile", "manage"}
NOT_SCANNED_DIRS = {"tests", "test", "docs", "examples", "scripts", "build", "dist", "venv"}


def _defined_here(pkg: str) -> list[tuple[str, type]]:
    """Concrete Environment subclasses (of either SDK) defined in the package's modules imported so
    far, as ('module.path', class); classes imported from the SDK or from elsewhere do not count."""
    from orsplatform.sandbox.loader import sdk_base

    found: dict[type, str] = {}
    for name, module in list(sys.modules.items()):
        if not name.startswith(pkg + ".") or module is None:
            continue
        for value in list(vars(module).values()):
            if (sdk_base(value) is not None and value.__module__ == name and value not in found
                    and not inspect.isabstract(value)):
                found[value] = name[len(pkg) + 1:]
    return sorted(((module, cls) for cls, module in found.items()), key=lambda mc: (mc[0], mc[1].__name__))


def _scan_order(package_dir: str) -> list[list[str]]:
    """Modules to import, in rounds: env.py, then server.py (where authors put the class next to
    ``Server([...]).run()``), then every other module and package (the root's and src/'s)."""
    from orsplatform.sandbox.loader import package_roots

    first, rest = [], []
    for index, root in enumerate(package_roots(package_dir)):
        base = Path(root)
        for path in sorted(base.glob("*.py")):
            if path.stem.isidentifier() and path.stem not in NOT_SCANNED:
                (first if index == 0 and path.stem in ("env", "server") else rest).append(path.stem)
        for folder in sorted(p for p in base.iterdir() if p.is_dir() and (p / "__init__.py").exists()):
            if not folder.name.isidentifier() or folder.name in NOT_SCANNED_DIRS:
                continue
            for path in sorted(folder.rglob("*.py")):
                parts = path.relative_to(base).with_suffix("").parts
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                if (parts and all(p.isidentifier() for p in parts) and not NOT_SCANNED_DIRS & set(parts)
                        and not parts[-1].startswith("test") and (path.parent / "__init__.py").exists()):
                    rest.append(".".join(parts))
    rounds = [[m] for m in ("env", "server") if m in first]
    return [*rounds, list(dict.fromkeys(rest))]


def discover_entrypoint(package_dir: str) -> str:
    """The package's one concrete Environment subclass (ors or openreward), looked for in env.py,
    then server.py (and what they import from the package), then every module of the package."""
    from orsplatform.sandbox.loader import register_package

    pkg = register_package(package_dir)
    failures: list[BaseException] = []
    for modules in _scan_order(package_dir):
        for module in modules:
            try:
                importlib.import_module(f"{pkg}.{module}")
            except Exception as exc:
                if len(modules) == 1:
                    raise  # env.py or server.py: its error is the package's error
                failures.append(exc)  # a helper script that does not import here is not the environment
        found = _defined_here(pkg)
        if len(found) == 1:
            module, cls = found[0]
            return f"{module}:{cls.__name__}"
        if len(found) > 1:
            names = ", ".join(f"{m}:{c.__name__}" for m, c in found)
            raise ValueError(f"Several Environment classes ({names}); name one with "
                             "entrypoint = 'module:Class' in manifest.toml.")
    if failures:
        raise failures[0]
    raise ValueError("No Environment subclass (ors.Environment or openreward.environments.Environment) "
                     "found in the package; name it with entrypoint = 'module:Class' in manifest.toml.")


def _lists_tasks(cls) -> bool:
    from orsplatform.sandbox.loader import sdk_base

    Environment = sdk_base(cls)
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


async def _send_tasks(cls, split: str, position: int, channel: Channel) -> tuple[int | None, dict | None]:
    """Sends the class's tasks of one split; (how many, the first), or (None, None) when it lists none."""
    tasks = await _class_tasks(cls, split)
    if tasks is None:
        return None, None
    count, first = 0, None
    async for spec in tasks:
        if not isinstance(spec, dict):
            raise TypeError(f"Task {count} of split {split!r} is {type(spec).__name__}, not a JSON object.")
        channel.task(position, spec)
        if first is None:
            first = json.loads(json.dumps(spec))  # as it was sent, whatever the class does to it later
        count += 1
    return count, first


async def inspect_package(package_dir: str, entrypoint: str, channel: Channel, sample: dict | None,
                          report: dict) -> dict:
    from orsplatform.sandbox.loader import load_environment_class, sdk_base, sdk_bases

    def stage(check: str) -> None:
        report["check"] = check
        channel.report(report)

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
    if sdk_bases()[sdk_base(cls)] == "openenv":
        return await inspect_openenv(package_dir, cls, channel, sample, report, stage)
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
    for position, split in enumerate(splits):
        counts[split["name"]], first = await _send_tasks(cls, split["name"], position, channel)
        if sample is None and first is not None:
            sample = first
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
    report.update(ok=True, check="done", class_name=cls.__name__, sdk=sdk_bases()[sdk_base(cls)])
    return report


def _task_file_splits(package_dir: str) -> list[str]:
    """Split names of the package's task files (``tasks/<split>.jsonl|csv|parquet``)."""
    folder = Path(package_dir) / "tasks"
    if not folder.is_dir():
        return []
    return sorted({p.stem for p in folder.iterdir() if p.suffix in (".jsonl", ".csv", ".parquet") and p.is_file()})


async def inspect_openenv(package_dir: str, cls, channel: Channel, sample: dict | None, report: dict,
                          stage) -> dict:
    """An OpenEnv-SDK class (sandbox/openenv_host.py): its app's declaration, its tools (its MCP
    tools, or one ``step`` tool taking its action), its splits (the package's task files, else one
    ``default`` split whose one task resets with no arguments) and a reset of a sample task."""
    from orsplatform.sandbox import openenv_host
    from orsplatform.sandbox.loader import register_package

    async def run(fn, *args):
        return await asyncio.to_thread(fn, *args)

    stage("declaration")
    declaration = openenv_host.declare(register_package(package_dir), package_dir, cls)
    stage("tools")
    if declaration.tool_env:
        tools = await openenv_host.list_tools(declaration, run)
        if not tools:
            raise ValueError("The environment's MCP server lists no tools.")
    else:
        tools = [openenv_host.step_tool(declaration)]
    stage("schemas")
    for tool in tools:
        _check_schema(tool)
    schemas = declaration.schemas()
    stage("splits")
    names = _task_file_splits(package_dir)
    counts: dict[str, int | None] = {name: None for name in names}
    if not names:
        names, counts = ["default"], {"default": 1}
        channel.task(0, {})
    splits = [_split(name) if name != "default" else {"name": name, "type": "train"} for name in names]
    if sample is None:
        sample = {}
    stage("prompt")
    episode = openenv_host.Episode(declaration, run)
    try:
        await episode.start(sample)
    finally:
        await episode.stop()
    report.update(tools=tools, splits=splits, task_counts=counts, prompt_checked=True, ok=True, check="done",
                  class_name=cls.__name__, sdk="openenv",
                  openenv={"kind": "mcp" if declaration.tool_env else "step", "env_name": declaration.env_name,
                           "schema": schemas})
    return report


def _platform_prefixes(package_dir: str) -> list[tuple[str, str]]:
    """Absolute paths of the platform that may appear in a message, and what stands for them."""
    import sysconfig

    from orsplatform.sandbox import loader

    pairs = [(str(Path(package_dir).resolve()) + "/", ""), (str(Path(package_dir)) + "/", "")]
    for path in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}:
        pairs.append((path + "/", "<python>/"))
    # The folder holding `orsplatform` (/ors/lib in the sandbox), wherever in the tree the loader sits.
    pairs.append((str(Path(loader.__file__).resolve().parents[loader.__name__.count(".")]) + "/", "<platform>/"))
    for path in {sys.prefix, sys.base_prefix, sysconfig.get_paths()["stdlib"]}:
        pairs.append((path + "/", "<python>/"))
    return sorted(pairs, key=lambda pair: -len(pair[0]))


SYNTHETIC = re.compile(r"orspkg_[0-9a-f]{16}\.?")


def scrub(text: str, package_dir: str) -> str:
    """``text`` without the platform's paths: the package's own files relative to its root, the
    interpreter's and the platform's files as <python>/ and <platform>/, module names as the
    package spells them (not under the synthetic package that holds them here)."""
    for prefix, replacement in _platform_prefixes(package_dir):
        text = text.replace(prefix, replacement)
    return SYNTHETIC.sub("", text)


def tenant_traceback(exc: BaseException, package_dir: str) -> str:
    """The traceback of ``exc`` (and the exceptions it chains) with the frames of the package's own
    files only, their paths relative to the package root: what the author wrote, and nothing of the
    platform (its paths, its files or the SDK's)."""
    roots = tuple(str(Path(p).resolve()) + "/" for p in (package_dir,))
    te = traceback.TracebackException.from_exception(exc)
    seen: set[int] = set()
    todo = [te]
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        frames = [traceback.FrameSummary(f.filename[len(root):], f.lineno, f.name, line=f.line)
                  for f in current.stack for root in roots if f.filename.startswith(root)]
        current.stack = traceback.StackSummary.from_list(frames)
        filename = getattr(current, "filename", None)  # a SyntaxError's file
        if isinstance(filename, str):
            current.filename = next((filename[len(r):] for r in roots if filename.startswith(r)), filename)
        todo += [t for t in (current.__cause__, current.__context__) if t is not None]
    return scrub("".join(te.format()), package_dir)


def _missing_field(exc: BaseException, spec) -> str | None:
    """The task field a failure names: the key of a KeyError raised for a key the row lacks."""
    if isinstance(exc, KeyError) and len(exc.args) == 1 and isinstance(exc.args[0], str):
        if not isinstance(spec, dict) or exc.args[0] not in spec:
            return exc.args[0]
    return None


async def _start_row(cls, spec, package_dir: str, openenv: bool) -> None:
    """A session's start on one task: the class built on it, setup(), get_prompt() (an OpenEnv
    class: its reset), and teardown()."""
    if openenv:
        from orsplatform.sandbox import openenv_host
        from orsplatform.sandbox.loader import register_package

        async def run(fn, *args):
            return await asyncio.to_thread(fn, *args)

        declaration = openenv_host.declare(register_package(package_dir), package_dir, cls)
        episode = openenv_host.Episode(declaration, run)
        try:
            await episode.start(spec)
        finally:
            await episode.stop()
        return
    env = cls(task_spec=spec, secrets={})
    await _maybe(env.setup())
    try:
        blocks = await _maybe(env.get_prompt())
        if not blocks:
            raise ValueError("get_prompt() returned no blocks.")
    finally:
        await _maybe(env.teardown())


async def check_rows(package_dir: str, entrypoint: str, rows: list, channel: Channel) -> dict:
    """Task rows of an upload run the way a session starts (catalog/row_check.py). Each row's
    failure is reported with its row and line, the field it lacks (a KeyError's key) and the
    traceback of the package's own frames; the report is sent before each row, so a process
    killed by its time limit still tells which row it was on."""
    from orsplatform.sandbox.loader import load_environment_class, sdk_base, sdk_bases

    report: dict = {"ok": False, "check": "import", "done": 0, "failures": []}
    channel.report(report)
    cls = load_environment_class(package_dir, entrypoint)
    openenv = sdk_bases()[sdk_base(cls)] == "openenv"
    report["check"] = "rows"
    for item in rows:
        report["running"] = item.get("row")
        channel.report(report)
        spec = item.get("spec")
        try:
            await _start_row(cls, spec, package_dir, openenv)
        except BaseException as exc:  # tenant code may raise anything, SystemExit included
            report["failures"].append({
                "row": item.get("row"), "line": item.get("line"), "field": _missing_field(exc, spec),
                "error": scrub(" ".join(f"{type(exc).__name__}: {exc}".split()), package_dir)[:2000],
                "traceback": tenant_traceback(exc, package_dir)[-8000:]})
        report["done"] += 1
    report.pop("running", None)
    report.update(ok=True, check="done")
    return report


def main() -> int:
    global _reserve
    package_dir, entrypoint = sys.argv[1:3]
    channel = Channel()
    request = json.loads(sys.stdin.buffer.read() or b"{}")
    sample = request.get("sample")
    _apply_limits()
    from orsplatform.sandbox.openenv_host import NoWebInterface

    NoWebInterface.install()  # as in the worker: OpenEnv's /web page (Gradio) is not served
    _reserve = bytearray(16 * 1024 * 1024)
    report: dict = {"ok": False, "check": "start"}
    try:
        if "rows" in request:  # an upload's sampled task rows, not a package's inspection
            report = asyncio.run(check_rows(package_dir, entrypoint, request["rows"], channel))
        else:
            report = asyncio.run(inspect_package(package_dir, entrypoint, channel, sample, report))
    except BaseException as exc:  # tenant code may raise anything, SystemExit included
        _reserve = None
        if isinstance(exc, MemoryError):
            limit = int(os.environ.get("ORS_INSPECT_MEMORY_BYTES", "0") or 0) // (1024 * 1024)
            error = f"MemoryError: the package exceeded the validation memory limit ({limit} MiB)."
        else:
            error = " ".join(f"{type(exc).__name__}: {exc}".split())  # one line, whatever the message
        tb = tenant_traceback(exc, package_dir)
        error = scrub(error, package_dir)
        del exc
        report.update(ok=False, error=error[:4000], traceback=tb[-20000:])
    channel.report(report)
    return 0 if report.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
