"""Archives whose shape (not their bytes) is the attack: many empty directories, deep or long
paths, a file and then a directory under it. Each is a 4xx naming the entry, never a 500, and
nothing is stored or left behind."""

from __future__ import annotations

import io
import tarfile
import zipfile

import pytest
from django.conf import settings

from orsplatform.catalog.models import Environment
from tests.catalog.conftest import leftover_uploads, stored_packages
from tests.catalog.support import ECHO_ENV, publish, zip_bytes


def refused(response, status: int = 400) -> str:
    assert response.status_code == status, response.content
    assert not Environment.objects.filter(slug="evil").exists()
    assert stored_packages(settings) == [] and leftover_uploads(settings) == []
    detail = response.json()["detail"]
    assert isinstance(detail, str) and detail
    return detail


def tar_of_directories(count: int, *, files: dict[str, str] | None = None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=9) as tf:
        for name, content in (files or {}).items():
            info = tarfile.TarInfo(name)
            info.size = len(content.encode())
            tf.addfile(info, io.BytesIO(content.encode()))
        for i in range(count):
            info = tarfile.TarInfo(f"d{i}")
            info.type = tarfile.DIRTYPE
            tf.addfile(info)
    return buf.getvalue()


def zip_with_directories(entries: list[tuple[str, str | None]]) -> bytes:
    """``entries``: (name, content) in order; content None makes a directory entry."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, content in entries:
            if content is None:
                zf.writestr(zipfile.ZipInfo(name.rstrip("/") + "/"), b"")
            else:
                zf.writestr(name, content)
    return buf.getvalue()


def test_a_tarball_of_100000_empty_directories_is_refused_and_not_stored(owner, settings):
    package = tar_of_directories(100_000, files={"env.py": ECHO_ENV})
    assert len(package) < 1024 * 1024  # tiny on the wire, hundreds of megabytes unpacked
    detail = refused(publish(owner, "evil", "dirs.tar.gz", package))
    assert f"more than {settings.ORS_MAX_PACKAGE_FILES} files and directories" in detail


def test_directories_count_against_the_unpacked_byte_budget(owner, settings):
    settings.ORS_MAX_PACKAGE_FILES = 1_000_000
    settings.ORS_MAX_PACKAGE_UNPACKED_BYTES = 2 * 1024 * 1024  # 512 directories' worth
    package = tar_of_directories(1000, files={"env.py": ECHO_ENV})
    assert "unpacks to more than" in refused(publish(owner, "evil", "dirs.tar.gz", package), 413)


def test_directories_implied_by_file_paths_count_as_entries(owner, settings):
    settings.ORS_MAX_PACKAGE_FILES = 20
    package = zip_bytes({"env.py": ECHO_ENV, **{f"d{i}/x.txt": "x" for i in range(12)}})
    assert "more than 20 files and directories" in refused(publish(owner, "evil", "many.zip", package))


def test_a_deep_path_is_refused_naming_it(owner, settings):
    deep = "/".join(["a"] * (settings.ORS_MAX_PACKAGE_PATH_DEPTH + 1)) + "/x.py"
    detail = refused(publish(owner, "evil", "deep.zip", zip_bytes({"env.py": ECHO_ENV, deep: "x = 1"})))
    assert "levels deep" in detail and "a/a/a" in detail


def test_a_deep_directory_in_a_tar_is_refused(owner, settings):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        info = tarfile.TarInfo("/".join(["d"] * 200))
        info.type = tarfile.DIRTYPE
        tf.addfile(info)
    assert "levels deep" in refused(publish(owner, "evil", "deep.tar.gz", buf.getvalue()))


def test_a_path_longer_than_the_limit_is_refused(owner, settings):
    long_path = "/".join(["b" * 200] * 8) + "/x.py"  # 8 levels, 1.6 KB
    detail = refused(publish(owner, "evil", "long.zip", zip_bytes({"env.py": ECHO_ENV, long_path: "x"})))
    assert f"longer than {settings.ORS_MAX_PACKAGE_PATH_BYTES} bytes" in detail


@pytest.mark.parametrize("filename", ["long.zip", "long.tar.gz"])
def test_a_300_character_directory_name_is_a_400_not_a_500(owner, filename):
    name = "d" * 300
    if filename.endswith(".zip"):
        package = zip_with_directories([("env.py", ECHO_ENV), (name, None), (f"{name}/x.py", "x = 1")])
    else:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tf:
            info = tarfile.TarInfo(name)
            info.type = tarfile.DIRTYPE
            tf.addfile(info)
        package = buf.getvalue()
    detail = refused(publish(owner, "evil", filename, package))
    assert "longer than 255 bytes" in detail and "ddd" in detail


def test_a_file_then_a_directory_under_it_is_a_400_naming_the_entry(owner):
    package = zip_with_directories([("env.py", ECHO_ENV), ("data", "a file"), ("data/inner", None)])
    detail = refused(publish(owner, "evil", "clash.zip", package))
    assert "'data/inner/'" in detail and "where the file 'data' is" in detail


def test_a_file_then_a_file_under_it_is_a_400(owner):
    package = zip_with_directories([("env.py", ECHO_ENV), ("data", "a file"), ("data/x.txt", "x")])
    assert "where the file 'data' is" in refused(publish(owner, "evil", "clash.zip", package))


def test_a_directory_then_a_file_of_the_same_name_is_a_400(owner):
    package = zip_with_directories([("env.py", ECHO_ENV), ("data/", None), ("data", "a file")])
    assert "where a directory of the same name is" in refused(publish(owner, "evil", "clash.zip", package))


def test_a_tar_with_a_file_then_a_directory_under_it_is_a_400(owner):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        info = tarfile.TarInfo("data")
        info.size = 1
        tf.addfile(info, io.BytesIO(b"x"))
        sub = tarfile.TarInfo("data/sub")
        sub.type = tarfile.DIRTYPE
        tf.addfile(sub)
    assert "where the file 'data' is" in refused(publish(owner, "evil", "clash.tar.gz", buf.getvalue()))


def test_a_zip_with_an_unsupported_compression_method_is_a_400(owner):
    package = bytearray(zip_bytes({"env.py": ECHO_ENV}))
    # The method field of the local header (offset 8) and of the central directory entry (offset 10).
    package[8:10] = (99).to_bytes(2, "little")
    central = package.rfind(b"PK\x01\x02")
    package[central + 10:central + 12] = (99).to_bytes(2, "little")
    detail = refused(publish(owner, "evil", "method.zip", bytes(package)))
    assert "env.py" in detail


def test_a_zip_listing_its_folder_after_the_folders_files_still_publishes(owner):
    package = zip_with_directories([("pkg/env.py", ECHO_ENV), ("pkg/", None)])
    r = publish(owner, "ordered", "ordered.zip", package)
    assert r.status_code == 201, r.json()
    assert r.json()["validation"]["tools"] == ["say"]
    assert leftover_uploads(settings) == []
