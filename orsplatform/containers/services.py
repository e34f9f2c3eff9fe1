"""Container versions: a package with a Dockerfile built into its image, inspected, recorded.

Called by the catalog's build (catalog/builds.py, on the Celery worker or the publishing CLI) for a
``building`` version whose package holds a Dockerfile. The image is named by the package's content
(``ors-env:<content hash>``), so two versions of one content share it; the record beside the stored
package (images.py) tells every pool how to start it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
from collections.abc import Callable
from pathlib import Path

from django.conf import settings

from orsplatform.containers import bases
from orsplatform.containers import build as image_builds
from orsplatform.containers.engine import Engine, EngineUnavailable
from orsplatform.containers.images import ImageRecord, archive_path, record_read, record_write, server_port
from orsplatform.containers.inspection import InspectionFailed, inspect_image
from orsplatform.containers.limits import container_limits
from orsplatform.containers.worker import shared_engine
from orsplatform.sandbox.registry_proxy import index_origins

REPOSITORY = "ors-env"
APP_TARGET = re.compile(r"([A-Za-z_][\w.]*):([A-Za-z_]\w*)")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
MAX_LAYERS = 200


class ContainerBuildFailed(Exception):
    def __init__(self, message: str, check: str) -> None:
        super().__init__(message)
        self.check = check


def has_dockerfile(package_dir: Path, manifest: dict | None = None) -> bool:
    """Is the package a container environment: a Dockerfile in OpenEnv's layout (``server/Dockerfile``,
    or one beside ``openenv.yaml``), or any Dockerfile with ``runtime = "container"`` in manifest.toml.
    A root Dockerfile in an ORS or OpenReward Python package stays a note (the package runs in the
    Python sandbox, as it always has)."""
    root = Path(package_dir)
    dockerfile = image_builds.dockerfile_of(root)
    if dockerfile is None:
        return False
    if manifest is None:
        from orsplatform.catalog.publishing import read_manifest

        manifest = read_manifest(root)
    if manifest.get("runtime") == "container":
        return True
    return (dockerfile.parent.name == "server" or (root / "openenv.yaml").is_file()
            or space_front_matter(root).get("sdk") == "docker")


def space_front_matter(root: Path) -> dict[str, str]:
    """A Hugging Face Space's settings: the ``---`` front matter of its README.md (``sdk: docker``,
    ``app_port: 7860``), read as flat ``key: value`` lines."""
    found: dict[str, str] = {}
    with contextlib.suppress(OSError, UnicodeDecodeError):
        lines = (Path(root) / "README.md").read_text(encoding="utf-8")[:8192].splitlines()
        if lines and lines[0].strip() == "---":
            for line in lines[1:]:
                if line.strip() == "---":
                    break
                key, sep, value = line.partition(":")
                if sep and not line.startswith((" ", "\t")):
                    found[key.strip()] = value.strip().strip("'\"")
    return found


def image_tag(content_hash: str) -> str:
    return f"{REPOSITORY}:{content_hash[:64]}"


def _proxy() -> image_builds.Proxy:
    tls, plain = index_origins([settings.ORS_BUILD_INDEX_URL, *settings.ORS_BUILD_EXTRA_INDEX_URLS])
    http = set(plain)
    for origin in settings.ORS_IMAGE_BUILD_HTTP_ORIGINS:
        host, _, port = origin.partition(":")
        if host:
            http.add((host.strip().lower(), int(port) if port.isdigit() else 80))
    hosts = set(settings.ORS_BUILD_ALLOWED_HOSTS) | set(settings.ORS_IMAGE_BUILD_ALLOWED_HOSTS)
    return image_builds.Proxy(hosts=hosts, http_origins=frozenset(http), index_tls=tls)


def _engine() -> Engine:
    try:
        return shared_engine()
    except EngineUnavailable as exc:
        raise ContainerBuildFailed(f"This platform cannot build or run container environments: {exc} "
                                   "Python environments are not affected.", check="containers") from None


def image_build(*, package_dir: Path, content_hash: str, log: Callable[[str], None]) -> ImageRecord:
    """The package's image, built (or found: the same content was built before) and recorded."""
    declared = declared_secrets(package_dir)
    engine = _engine()
    tag = image_tag(content_hash)
    proxy = _proxy()
    timeout = settings.ORS_BUILD_TIMEOUT_SECONDS

    def build(context: Path, name: str, write: Callable[[str], None], dockerfile: Path | None = None) -> str:
        return image_builds.build(engine=engine, context_dir=context, dockerfile=dockerfile, tag=name, proxy=proxy,
                                  log=write, timeout=timeout)

    try:
        bases.ensure(engine, log, build)
        log(f"[platform] building the image from {image_builds.dockerfile_of(package_dir).relative_to(package_dir)}")
        image = build(package_dir, tag, log)
    except image_builds.BuildFailed as exc:
        raise ContainerBuildFailed(str(exc), check="image") from None
    except RuntimeError as exc:  # a local base could not be made
        raise ContainerBuildFailed(str(exc), check="image") from None
    record = dataclasses.replace(describe(engine, image=image, tag=tag, package_dir=package_dir), secrets=declared)
    if settings.ORS_CONTAINER_ARCHIVES:
        _archive(engine, record, package_dir, log)
    record_write(package_dir, record)
    log(f"[platform] image {image[:19]}: {len(record.layers)} layers, {record.size / 1e6:.1f} MB")
    return record


def declared_secrets(package_dir: Path) -> list[str]:
    """The manifest's ``required_secrets``: the secrets of a session the image's server receives, as
    environment variables of its process (worker.py), so each must be a variable's name."""
    from orsplatform.catalog.publishing import read_manifest

    names = [str(n) for n in read_manifest(Path(package_dir)).get("required_secrets") or []]
    wrong = [n for n in names if not ENV_NAME.fullmatch(n) or n == "PORT"]
    if wrong:
        raise ContainerBuildFailed(f"required_secrets {', '.join(repr(n) for n in wrong)[:300]}: a container "
                                   "environment's server receives its secrets as environment variables, so each "
                                   "name must be one (letters, digits and _, not starting with a digit; PORT is "
                                   "the platform's).", check="manifest")
    return sorted(set(names))


def _archive(engine: Engine, record: ImageRecord, package_dir: Path, log: Callable[[str], None]) -> None:
    """``docker save`` of the image beside the package, for runner nodes' engines (images.archive_path)."""
    target = archive_path(package_dir)
    if target.is_file():
        return
    partial = target.with_name(target.name + ".partial")
    engine.run("save", "-o", str(partial), record.tag, timeout=1800)
    partial.replace(target)
    log(f"[platform] image archived for runner nodes ({target.stat().st_size / 1e6:.0f} MB)")


def describe(engine: Engine, *, image: str, tag: str, package_dir: Path) -> ImageRecord:
    """The record of a built image: its own command and port, its layers and size."""
    info = json.loads(engine.run("image", "inspect", image, timeout=30).stdout)[0]
    config = info.get("Config") or {}
    command = [*(config.get("Entrypoint") or []), *(config.get("Cmd") or [])]
    history = json.loads(engine.run("image", "history", "--no-trunc", "--format", "{{json .}}", image, timeout=30)
                         .stdout.decode().replace("}\n{", "},{").join(["[", "]"]) or "[]")
    layers = [{"id": str(h.get("ID", ""))[:80], "size": str(h.get("Size", "")), "created_by":
               str(h.get("CreatedBy", ""))[:300]} for h in history[:MAX_LAYERS]]
    return ImageRecord(image=image, tag=tag, command=[str(a) for a in command],
                       port=server_port(command, config.get("Env") or [], _openenv_port(package_dir)),
                       layers=layers, size=int(info.get("Size") or 0))


def _openenv_port(package_dir: Path) -> int | None:
    """openenv.yaml's ``port``, else a Hugging Face Space's ``app_port``."""
    app_port = space_front_matter(package_dir).get("app_port", "")
    with contextlib.suppress(OSError, UnicodeDecodeError):
        for line in (Path(package_dir) / "openenv.yaml").read_text(encoding="utf-8").splitlines():
            key, sep, value = line.partition(":")
            if sep and key.strip() == "port" and value.strip().isdigit():
                return int(value.strip())
    return int(app_port) if app_port.isdigit() else None


def image_inspect(*, package_dir: Path, record: ImageRecord, sample: dict | None, task_names: list[str],
                  log: Callable[[str], None]) -> tuple[dict, list[dict] | None]:
    """The inspection report publishing writes (tools, splits, the OpenEnv declaration) and, for a
    package without task files, its one default task."""
    log("[platform] starting the image under gVisor to read its server's schemas and tools")
    try:
        facts = inspect_image(engine=_engine(), record=record, limits=container_limits(str(package_dir)),
                              sample=sample, timeout=settings.ORS_IMAGE_INSPECT_TIMEOUT_SECONDS)
    except InspectionFailed as exc:
        raise ContainerBuildFailed(str(exc), check="inspect") from None
    names = task_names or ["default"]
    splits = [{"name": name, "type": _split_type(name)} for name in names]
    counts: dict[str, int | None] = {name: None for name in names}
    default_tasks = None
    if not task_names:
        splits, counts, default_tasks = [{"name": "default", "type": "train"}], {"default": 1}, [{}]
    metadata = facts.get("metadata") if isinstance(facts.get("metadata"), dict) else {}
    env_name = str(metadata.get("name") or (package_dir.name if not task_names else "environment"))[:200]
    report = {"entrypoint": _entrypoint(record.command), "tools": facts["tools"], "splits": splits,
              "task_counts": counts, "ok": True,
              "openenv": {"kind": facts.get("kind") if facts.get("kind") in ("mcp", "step") else "step",
                          "env_name": env_name, "schema": facts.get("schema") or {}}}
    log(f"[platform] the server answers: {len(facts['tools'])} tool(s) "
        f"({', '.join(t['name'] for t in facts['tools'][:10])})")
    return report, default_tasks


def _split_type(name: str) -> str:
    lowered = name.lower()
    if lowered.startswith("test"):
        return "test"
    if lowered.startswith(("val", "dev")):
        return "validation"
    return "train"


def _entrypoint(command: list[str]) -> str:
    """``module:app`` of the image's server when its command names one (uvicorn's argument)."""
    for arg in command:
        for match in APP_TARGET.finditer(arg):
            return f"{match.group(1)}:{match.group(2)}"[:200]
    return "container:server"


def image_record(package_dir: str) -> ImageRecord | None:
    return record_read(package_dir)


def images_collect_unused() -> list[str]:
    """Remove the images no live version uses (``ors-env:<content hash>`` of a version that failed, or
    whose environment was deleted), then the layers nothing refers to any more. Only on an engine
    that is running: collecting never starts one."""
    from orsplatform.catalog.models import EnvironmentVersion
    from orsplatform.containers.engine import Engine, containers_dir

    configured = settings.ORS_DOCKER_HOST
    state = Path(containers_dir())
    engine = Engine(host=configured or f"unix://{state}/docker.sock", state=state)
    if not engine.answers():
        return []
    keep = {image_tag(h) for h in EnvironmentVersion.objects.exclude(status=EnvironmentVersion.Status.FAILED)
            .filter(environment__deleted_at__isnull=True).values_list("content_hash", flat=True)}
    listed = engine.run("images", REPOSITORY, "--format", "{{.Repository}}:{{.Tag}}", timeout=60).stdout.decode()
    removed = [tag for tag in listed.split() if tag not in keep]
    for tag in removed:
        # Untagged even while a retiring container still runs it; its layers go with a later prune.
        engine.run("rmi", "--force", tag, timeout=120, check=False)
    engine.run("image", "prune", "-f", timeout=300, check=False)
    return removed
