"""Archives that try to escape the package directory, exhaust the disk or lie about their type are
refused with a clear 4xx before any tenant code runs, and nothing is published or left behind."""

from __future__ import annotations

import io
import os
import tarfile
import zipfile

import pytest

from orsplatform.catalog.models import Environment
from tests.catalog.conftest import leftover_uploads, stored_packages
from tests.catalog.support import ECHO_ENV, publish, tar_bytes, zip_bytes


def refused(response, status: int = 400) -> str:
    assert response.status_code == status, response.content
    body = response.json()
    assert not Environment.objects.filter(slug="evil").exists()
    return body["detail"]


@pytest.fixture(autouse=True)
def nothing_left_behind(settings):
    yield
    assert stored_packages(settings) == []
    assert leftover_uploads(settings) == []


def test_a_zip_slip_member_is_refused(owner, tmp_path):
    package = zip_bytes({"env.py": ECHO_ENV, "../../evil.py": "print('escaped')"})
    assert "outside the package" in refused(publish(owner, "evil", "evil.zip", package))
    assert not (tmp_path / "evil.py").exists()


def test_a_tar_slip_member_is_refused(owner):
    package = tar_bytes({"env.py": ECHO_ENV, "a/../../../evil.py": "x = 1"})
    assert "outside the package" in refused(publish(owner, "evil", "evil.tar.gz", package))


@pytest.mark.parametrize("name", ["/etc/evil.py", "C:/evil.py", "\\\\server\\evil.py"])
def test_an_absolute_path_member_is_refused(owner, name):
    package = zip_bytes({"env.py": ECHO_ENV, name: "x = 1"})
    assert "absolute path" in refused(publish(owner, "evil", "evil.zip", package))


def test_an_absolute_path_in_a_tar_is_refused(owner):
    package = tar_bytes({"env.py": ECHO_ENV, "/tmp/evil.py": "x = 1"})
    assert "absolute path" in refused(publish(owner, "evil", "evil.tar.gz", package))


def test_a_symlink_in_a_zip_is_refused(owner):
    package = zip_bytes({"env.py": ECHO_ENV}, symlinks={"secrets.txt": "/etc/passwd"})
    assert "symbolic link" in refused(publish(owner, "evil", "evil.zip", package))


@pytest.mark.parametrize("kind", [tarfile.SYMTYPE, tarfile.LNKTYPE])
def test_symlinks_and_hardlinks_in_a_tar_are_refused(owner, kind):
    package = tar_bytes({"env.py": ECHO_ENV}, links={"passwd": (kind, "/etc/passwd")})
    assert "link" in refused(publish(owner, "evil", "evil.tar.gz", package))


def test_a_device_or_fifo_in_a_tar_is_refused(owner):
    package = tar_bytes({"env.py": ECHO_ENV}, links={"dev": (tarfile.CHRTYPE, ""), "fifo": (tarfile.FIFOTYPE, "")})
    assert "not a regular file" in refused(publish(owner, "evil", "evil.tar.gz", package))


def test_a_zip_bomb_is_refused_by_its_compression_ratio(owner):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        zf.writestr("env.py", ECHO_ENV)
        zf.writestr("zeros.bin", b"\0" * (30 * 1024 * 1024))
    assert len(buf.getvalue()) < 100_000
    assert "zip bomb" in refused(publish(owner, "evil", "bomb.zip", buf.getvalue()))


def test_a_tar_gz_bomb_is_refused_by_its_unpacked_size(owner, settings):
    settings.ORS_MAX_PACKAGE_UNPACKED_BYTES = 4 * 1024 * 1024
    package = tar_bytes({"env.py": ECHO_ENV, "zeros.bin": b"\0" * (8 * 1024 * 1024)})
    assert "unpacks to more than" in refused(publish(owner, "evil", "bomb.tar.gz", package), 413)


def test_too_many_files_are_refused(owner, settings):
    settings.ORS_MAX_PACKAGE_FILES = 20
    package = zip_bytes({"env.py": ECHO_ENV, **{f"data/{i}.txt": "x" for i in range(30)}})
    assert "more than 20 files" in refused(publish(owner, "evil", "many.zip", package))


def test_a_package_over_the_size_limit_answers_413(owner, settings):
    settings.ORS_MAX_PACKAGE_BYTES = 100_000
    package = zip_bytes({"env.py": ECHO_ENV, "noise.bin": os.urandom(150_000)})
    assert len(package) > 100_000
    assert "limit" in refused(publish(owner, "evil", "big.zip", package), 413)


@pytest.mark.parametrize("filename,content,what", [
    ("evil.zip", b"this is not a zip at all", "not a zip"),
    ("evil.tar.gz", zip_bytes({"env.py": ECHO_ENV}), "not a tar.gz"),
    ("evil.py", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "not a py"),
    ("evil.py", b"print('caf\xe9')\n", "not Python source"),
    ("evil.rar", b"Rar!\x1a\x07\x00", "Unsupported package"),
])
def test_a_file_that_is_not_what_its_extension_says_is_refused(owner, filename, content, what):
    assert what in refused(publish(owner, "evil", filename, content))


def test_a_truncated_zip_is_refused_cleanly(owner):
    package = zip_bytes({"env.py": ECHO_ENV})
    assert "zip" in refused(publish(owner, "evil", "cut.zip", package[: len(package) // 2]))


def test_an_upload_without_the_package_field_is_a_400(owner):
    from tests.catalog.support import api

    r = api(owner).post("/api/v1/environments/acme/evil/versions", {"file": io.BytesIO(b"x")})
    assert r.status_code == 400 and "package" in r.json()["detail"]
