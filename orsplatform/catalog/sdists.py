"""Requirements published only as source distributions: which ones a wheels-only resolve could not
meet, where their sdist is on the package index, and whether what a source build handed back is
the one wheel it was asked for.

The build itself (catalog/pyenvs.py) runs in a sandbox of its own: a source distribution's
setup.py or build backend is code nobody here chose, so it never sees the shared uv cache or the
environments' folder. This module is the platform's side: it reads the index as data (PEP 691
JSON, else PEP 503 HTML) with a size cap and checks the sdist's hash when the index gives one, and
reads the build's output folder (which the sandbox could write) through untrusted_files.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import httpx
from django.conf import settings
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.tags import sys_tags
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from orsplatform.sandbox import untrusted_files

INDEX_PAGE_BYTES = 16 * 1024 * 1024
SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"
# uv's explanation of a wheels-only resolve that failed for want of a wheel (uv 0.9+):
#   "Because foo==1.0 has no usable wheels …", "hint: Wheels are required for `foo` because …"
_NO_WHEELS = re.compile(r"\b([A-Za-z0-9][A-Za-z0-9._-]*)(?:==([A-Za-z0-9.+!_-]+))? ha(?:s|ve) no usable wheels")
_REQUIRED = re.compile(r"Wheels are required for `([^`]+)`")
_ALL_VERSIONS = re.compile(r"all versions of ([A-Za-z0-9][A-Za-z0-9._-]*) have no usable wheels")


class SdistError(Exception):
    """The source distribution could not be found, fetched or built; the message names the package."""


@dataclass(frozen=True)
class Sdist:
    name: str  # canonical
    version: str
    filename: str
    url: str
    sha256: str | None


def indexes() -> list[str]:
    """The build's package indexes, in the order uv searches them."""
    return [*settings.ORS_BUILD_EXTRA_INDEX_URLS, settings.ORS_BUILD_INDEX_URL]


def wanted(output: str) -> dict[str, str | None]:
    """The packages (canonical name -> version when uv named one) a wheels-only resolve failed on
    for want of a wheel; empty when it failed for another reason."""
    found: dict[str, str | None] = {}
    for match in _REQUIRED.finditer(output):
        found.setdefault(canonicalize_name(match.group(1)), None)
    for match in _ALL_VERSIONS.finditer(output):
        found.setdefault(canonicalize_name(match.group(1)), None)
    for match in _NO_WHEELS.finditer(output):
        if match.group(1) in ("versions", "of"):
            continue
        name = canonicalize_name(match.group(1))
        if match.group(2) and (name in found or _REQUIRED.search(output) is None):
            found[name] = match.group(2)
    return found


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.files: list[dict] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag != "a":
            return
        a = dict(attrs)
        if a.get("href"):
            self.files.append({"href": a["href"], "requires-python": a.get("data-requires-python"),
                               "yanked": "data-yanked" in a})

    def handle_endtag(self, tag: str) -> None:
        pass


def _page(client: httpx.Client, index: str, name: str) -> tuple[str, list[dict]] | None:
    """The project's files on one index ([{filename, url, sha256, requires-python, yanked}]), None
    when the index does not have the project."""
    url = f"{index.rstrip('/')}/{name}/"
    with client.stream("GET", url, headers={"Accept": f"{SIMPLE_JSON}, text/html;q=0.1"}) as r:
        if r.status_code == 404:
            return None
        if r.status_code != 200:
            raise SdistError(f"the package index answered {r.status_code} for {name}")
        body = b""
        for chunk in r.iter_bytes():
            body += chunk
            if len(body) > INDEX_PAGE_BYTES:
                raise SdistError(f"the package index's page for {name} is over {INDEX_PAGE_BYTES // 2**20} MiB")
        kind, final = r.headers.get("content-type", ""), str(r.url)
    files = []
    if kind.startswith(SIMPLE_JSON):
        for f in json.loads(body).get("files", []):
            files.append({"filename": f.get("filename", ""), "url": urljoin(final, f.get("url", "")),
                          "sha256": (f.get("hashes") or {}).get("sha256"),
                          "requires-python": f.get("requires-python"), "yanked": bool(f.get("yanked"))})
    else:
        parser = _Links()
        parser.feed(body.decode("utf-8", "replace"))
        for link in parser.files:
            href, _, fragment = link["href"].partition("#")
            algo, _, digest = fragment.partition("=")
            files.append({"filename": urlsplit(href).path.rsplit("/", 1)[-1], "url": urljoin(final, href),
                          "sha256": digest if algo == "sha256" else None,
                          "requires-python": link["requires-python"], "yanked": link["yanked"]})
    return final, files


def _python_ok(requires: str | None) -> bool:
    import platform

    try:
        return not requires or SpecifierSet(requires).contains(platform.python_version(), prereleases=True)
    except ValueError:
        return False


def find(name: str, version: str | None, requirements: list[str]) -> Sdist:
    """The source distribution to build for ``name``: ``version`` when uv named one, else the
    newest the declared requirement on it admits, from the first index that has the project."""
    specifier = SpecifierSet()
    for line in requirements:
        requirement = Requirement(line)
        if canonicalize_name(requirement.name) == name:
            specifier &= requirement.specifier
    with httpx.Client(timeout=60, follow_redirects=True) as client:
        for index in indexes():
            try:
                page = _page(client, index, name)
            except httpx.HTTPError as exc:
                raise SdistError(f"{name}: the package index could not be read ({type(exc).__name__})") from None
            if page is None:
                continue
            candidates: list[tuple[Version, dict]] = []
            for f in page[1]:
                try:
                    project, found = parse_sdist_filename(f["filename"])
                except (InvalidSdistFilename, InvalidVersion):
                    continue
                if project != name or f["yanked"] or not _python_ok(f["requires-python"]):
                    continue
                if version is not None and found != Version(version):
                    continue
                if version is None and not specifier.contains(found, prereleases=specifier.prereleases):
                    continue
                candidates.append((found, f))
            if not candidates:
                break  # first index that has the project decides, as uv does
            found, f = max(candidates, key=lambda c: c[0])
            return Sdist(name, str(found), f["filename"], f["url"], f["sha256"])
    wanted_text = f"{name}=={version}" if version else f"{name}{specifier}"
    raise SdistError(f"{name}: the package index has neither a usable wheel nor a source distribution of {wanted_text}")


def download(sdist: Sdist, folder: Path) -> Path:
    """The sdist saved in ``folder`` (size-capped, its hash checked when the index gave one)."""
    limit = settings.ORS_BUILD_MAX_SDIST_BYTES
    target = folder / sdist.filename
    digest = hashlib.sha256()
    size = 0
    try:
        with httpx.Client(timeout=120, follow_redirects=True) as client, client.stream("GET", sdist.url) as r:
            if r.status_code != 200:
                raise SdistError(f"{sdist.name} {sdist.version}: the package index answered {r.status_code} "
                                 f"for {sdist.filename}")
            with target.open("wb") as fh:
                for chunk in r.iter_bytes():
                    size += len(chunk)
                    if size > limit:
                        raise SdistError(f"{sdist.name} {sdist.version}: {sdist.filename} is over "
                                         f"{limit // 2**20} MiB (ORS_BUILD_MAX_SDIST_BYTES)")
                    digest.update(chunk)
                    fh.write(chunk)
    except httpx.HTTPError as exc:
        raise SdistError(f"{sdist.name} {sdist.version}: {sdist.filename} could not be downloaded "
                         f"({type(exc).__name__})") from None
    if sdist.sha256 and digest.hexdigest() != sdist.sha256.lower():
        raise SdistError(f"{sdist.name} {sdist.version}: {sdist.filename} does not match the index's sha256")
    return target


def built_wheel(sdist: Sdist, out: Path, limit: int) -> tuple[str, bytes]:
    """The one wheel the source build of ``sdist`` left in ``out`` (file name, bytes): a regular
    file, named for that package and version, installable here. Anything else fails the build."""
    try:  # lstat: the sandbox could have put a link where the folder was
        names = sorted(os.listdir(out)) if stat.S_ISDIR(os.lstat(out).st_mode) else []
    except OSError:
        names = []
    wheels = [n for n in names if n.endswith(".whl")]
    if len(wheels) != 1:
        raise SdistError(f"{sdist.name} {sdist.version}: the source build left {len(wheels)} wheels, not one")
    filename = wheels[0]
    try:
        project, version, _, tags = parse_wheel_filename(filename)
    except (InvalidWheelFilename, InvalidVersion):
        raise SdistError(f"{sdist.name} {sdist.version}: the source build's wheel name {filename!r} is invalid") from None
    if project != sdist.name or version != Version(sdist.version):
        raise SdistError(f"{sdist.name} {sdist.version}: the source build made a wheel of {project} {version}")
    if not set(tags) & set(sys_tags()):
        raise SdistError(f"{sdist.name} {sdist.version}: the source build's wheel {filename} cannot be installed here")
    try:
        data = untrusted_files.read(out, filename, limit=limit)
    except OSError as exc:
        raise SdistError(f"{sdist.name} {sdist.version}: the source build's wheel was refused "
                         f"({exc.strerror or exc})") from None
    return filename, data
