"""Where archived periods of the audit log are kept: a folder (the embedded default) or any
S3-compatible store (production), chosen by ORS_AUDIT_ARCHIVE_URL.

Files are immutable and named by their content (auditlog/archive.py), so a retried write puts the
same bytes under the same name and a reader never sees a file change under it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Protocol
from urllib.parse import urlparse

from django.conf import settings

CHUNK = 1 << 20


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


class ArchiveStore(Protocol):
    def put(self, key: str, path: Path) -> None: ...

    def local(self, key: str) -> Path:
        """A local file holding the key's bytes (the file itself, or a cached download)."""
        ...

    def sha256(self, key: str) -> str | None:
        """The SHA-256 of the stored bytes, read back from the store; None when absent."""
        ...


class DirectoryStore:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if not path.is_relative_to(self.root.resolve()):
            raise ValueError(f"archive key outside the store: {key!r}")
        return path

    def put(self, key: str, path: Path) -> None:
        target = self._path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".partial")
        shutil.copyfile(path, partial)
        with open(partial, "rb") as f:
            os.fsync(f.fileno())
        os.replace(partial, target)  # whole or absent, never half a file under the key

    def local(self, key: str) -> Path:
        return self._path(key)

    def sha256(self, key: str) -> str | None:
        path = self._path(key)
        return sha256_of(path) if path.exists() else None


class S3Store:
    """An S3-compatible bucket through boto3 (AWS S3, MinIO, Ceph, R2...). Credentials come from
    boto3's own chain (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, a profile, an instance role)."""

    def __init__(self, bucket: str, prefix: str, endpoint_url: str | None, cache: Path) -> None:
        import boto3

        self.bucket, self.prefix, self.cache = bucket, prefix.strip("/"), Path(cache)
        self.client = boto3.client("s3", endpoint_url=endpoint_url or None)

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def put(self, key: str, path: Path) -> None:
        self.client.upload_file(str(path), self.bucket, self._key(key))

    def local(self, key: str) -> Path:
        target = self.cache / key
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(target.name + f".{os.getpid()}.partial")
            self.client.download_file(self.bucket, self._key(key), str(partial))
            os.replace(partial, target)
        return target

    def sha256(self, key: str) -> str | None:
        from botocore.exceptions import ClientError

        try:
            body = self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"]
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None
            raise
        digest = hashlib.sha256()
        for block in body.iter_chunks(CHUNK):
            digest.update(block)
        return digest.hexdigest()


def archive_store() -> ArchiveStore:
    url = settings.ORS_AUDIT_ARCHIVE_URL
    if url.startswith("s3://"):
        parsed = urlparse(url)
        return S3Store(parsed.netloc, parsed.path, settings.ORS_AUDIT_ARCHIVE_S3_ENDPOINT,
                       settings.ORS_AUDIT_ARCHIVE_DIR / "s3-cache")
    return DirectoryStore(Path(url) if url else settings.ORS_AUDIT_ARCHIVE_DIR)
