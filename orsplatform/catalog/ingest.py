"""Task files into the Task table: streaming readers and a batched writer.

Readers never hold the file in memory: JSONL is read line by line (with a cap on one line), CSV row by
row, Parquet batch by batch. Each yields ``(line, text)`` with ``text`` the task as JSON, after checking
that it is a JSON object; bad rows are recorded with their line (or row) number instead. The writer
inserts in batches: COPY on PostgreSQL, executemany on SQLite.
"""

from __future__ import annotations

import contextlib
import csv
import datetime
import decimal
import io
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from django.conf import settings
from django.db import connection

from orsplatform import bounded_json
from orsplatform.catalog.models import Task

FORMATS = ("jsonl", "csv", "parquet")
EXTENSIONS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".csv": "csv", ".parquet": "parquet"}
SPLIT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
BATCH = 5000
MAX_ERRORS = 20
PROGRESS_EVERY_SECONDS = 0.25
PARQUET_MAGIC = b"PAR1"
# First bytes of files that are certainly not text, for a clear message instead of "invalid JSON".
BINARY_MAGIC = {b"PK\x03\x04": "a zip archive", b"\x1f\x8b": "gzip data", PARQUET_MAGIC: "a Parquet file",
                b"\x89PNG": "a PNG image", b"%PDF": "a PDF document"}

Progress = Callable[[int, int], None]  # (rows_done, bytes_done)


def progress_key(job_id: int) -> str:
    """The cache key under which a running ingest publishes its progress."""
    return f"ors:ingest-progress:{job_id}"


class IngestError(Exception):
    """A task file that cannot be ingested; ``errors`` lists ``{"line", "error"}`` (line may be None)."""

    def __init__(self, message: str, errors: list[dict] | None = None) -> None:
        super().__init__(message)
        self.errors = errors or []

    def report(self) -> dict:
        return {"detail": str(self), "errors": self.errors}


class RowsFailed(IngestError):
    """Sampled rows that fail in the environment (catalog/row_check.py): the upload is refused
    unless its author accepted failing rows."""

    def __init__(self, message: str, errors: list[dict], sampled: int) -> None:
        super().__init__(message, errors)
        self.sampled = sampled

    def report(self) -> dict:
        return {**super().report(), "check": "rows", "sampled": self.sampled}


class UploadTooLarge(IngestError):
    """More than the platform takes: answered 413."""


class TaskQuotaExceeded(UploadTooLarge):
    """More tasks than a quota leaves room for (ORS_MAX_TASKS_PER_SPLIT, ORS_MAX_TASKS_PER_TEAM): 413,
    and nothing of the file is written."""

    def report(self) -> dict:
        return {**super().report(), "check": "quota"}


@dataclass(frozen=True)
class Quota:
    room: int  # how many tasks this ingest may still write
    message: str  # why not one more, for the TaskQuotaExceeded


def declared_rows(path: Path, fmt: str) -> int | None:
    """The row count a file declares up front (a Parquet footer), so a tiny file claiming millions of
    rows is refused before a row is read; None for formats that only tell by being read. Streaming
    still counts: a footer may lie."""
    if fmt != "parquet":
        return None
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path).metadata.num_rows
    except Exception:  # unreadable: reported with its reason when the file is read
        return None


@dataclass
class Errors:
    limit: int = MAX_ERRORS
    items: list[dict] = field(default_factory=list)
    more: bool = False

    def add(self, line: int | None, error: str) -> None:
        if len(self.items) < self.limit:
            self.items.append({"line": line, "error": error})
        else:
            self.more = True

    @property
    def full(self) -> bool:
        return self.more

    def __bool__(self) -> bool:
        return bool(self.items)


def format_for(filename: str, explicit: str | None = None) -> str:
    if explicit:
        if explicit not in FORMATS:
            raise IngestError(f"Unknown task file format {explicit!r}; use one of {', '.join(FORMATS)}.")
        return explicit
    for suffix, fmt in EXTENSIONS.items():
        if filename.lower().endswith(suffix):
            return fmt
    raise IngestError(f"Cannot tell the format of {filename!r}: name it .jsonl, .csv or .parquet.")


def validate_split_name(name: str | None) -> str:
    if not name or not name.strip():
        raise IngestError("A split name is required.")
    if not SPLIT_NAME.match(name):
        raise IngestError(f"Invalid split name {name!r}: use letters, digits, '_', '-' or '.' (at most 100).")
    return name


def sniff(path: Path, fmt: str) -> None:
    """The file's first bytes must match its declared format."""
    with path.open("rb") as fh:
        head = fh.read(8)
        if fmt == "parquet":
            fh.seek(0, io.SEEK_END)
            size = fh.tell()
            fh.seek(max(size - 4, 0))
            tail = fh.read(4)
            if head[:4] != PARQUET_MAGIC or tail != PARQUET_MAGIC:
                raise IngestError("The file is not a Parquet file, whatever its name says.")
            return
    for magic, what in BINARY_MAGIC.items():
        if head.startswith(magic):
            raise IngestError(f"The file is {what}, not {fmt} text.")


def _loads_object(raw: bytes | str, errors: Errors, line: int) -> bool:
    try:
        value = bounded_json.loads(raw)
    except bounded_json.JsonRefused as exc:
        errors.add(line, str(exc))
        return False
    if not isinstance(value, dict):
        errors.add(line, f"expected a JSON object, got {_kind(value)}")
        return False
    return True


def _kind(value) -> str:
    return {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number",
            type(None): "null"}.get(type(value), type(value).__name__)


def read_jsonl(path: Path, errors: Errors, position: list[int]) -> Iterator[tuple[int, bytes]]:
    max_line = settings.ORS_MAX_TASK_BYTES
    with path.open("rb") as fh:
        number = 0
        while True:
            raw = fh.readline(max_line + 1)
            if not raw:
                break
            number += 1
            if len(raw) > max_line and not raw.endswith(b"\n"):
                errors.add(number, f"line longer than {max_line} bytes")
                while (rest := fh.readline(1024 * 1024)) and not rest.endswith(b"\n"):
                    pass  # skip the rest of the over-long line without holding it
                continue
            if not number & 1023:  # tell() per line would cost more than the parse
                position[0] = fh.tell()
            if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            raw = raw.strip()
            if not raw:
                continue  # blank lines (a trailing newline, a separator) carry no task
            if b"\\u0000" in raw:
                errors.add(number, "NUL characters (\\u0000) are not allowed in tasks")
                continue
            if _loads_object(raw, errors, number):
                yield number, raw


class _Undecodable(Exception):
    def __init__(self, line: int, reason: str) -> None:
        super().__init__(reason)
        self.line = line


def _text_lines(binary, max_line: int) -> Iterator[str]:
    """Physical lines decoded one by one, so a decoding error names its own line."""
    number = 0
    while raw := binary.readline(max_line + 1):
        number += 1
        if len(raw) > max_line and not raw.endswith(b"\n"):
            raise _Undecodable(number, f"line longer than {max_line} bytes")
        if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _Undecodable(number, f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def read_csv(path: Path, errors: Errors, position: list[int]) -> Iterator[tuple[int, bytes]]:
    with path.open("rb") as binary:
        reader = csv.reader(_text_lines(binary, settings.ORS_MAX_TASK_BYTES), strict=True)
        try:
            header = next(reader, None)
        except (_Undecodable, csv.Error) as exc:
            errors.add(getattr(exc, "line", 1), f"unreadable header: {exc}")
            return
        if not header or any(not h.strip() for h in header):
            errors.add(1, "the header row must name every column")
            return
        if len(set(header)) != len(header):
            errors.add(1, "the header row names a column twice")
            return
        width = len(header)
        while True:
            try:
                fields = next(reader)
            except StopIteration:
                break
            except _Undecodable as exc:
                errors.add(exc.line, f"unreadable row: {exc}")
                return  # the reader cannot resynchronise after bad bytes
            except csv.Error as exc:
                errors.add(reader.line_num, f"unreadable row: {exc}")
                return  # nor after a broken quote
            position[0] = binary.tell()
            line = reader.line_num
            if not fields:
                continue  # a blank line
            if len(fields) > width:
                errors.add(line, f"{len(fields)} fields, the header has {width}")
                continue
            if len(fields) < width:
                errors.add(line, f"fewer fields than the header's {width}")
                continue
            text_row = orjson.dumps(dict(zip(header, fields, strict=True)))
            if b"\\u0000" in text_row:
                errors.add(line, "NUL characters are not allowed in tasks")
                continue
            yield line, text_row


def _json_default(value):
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, (datetime.timedelta,)):
        return value.total_seconds()
    if isinstance(value, bytes):
        return value.decode("utf-8")  # UnicodeDecodeError: reported as the row's error
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def read_parquet(path: Path, errors: Errors, position: list[int]) -> Iterator[tuple[int, bytes]]:
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises several unrelated types for a broken file
        errors.add(None, f"unreadable Parquet file: {exc}")
        return
    total_rows = max(parquet.metadata.num_rows, 1)
    size = path.stat().st_size
    number = 0
    try:
        for batch in parquet.iter_batches(batch_size=BATCH):
            for row in batch.to_pylist():
                number += 1
                try:
                    text_row = orjson.dumps(row, default=_json_default,
                                            option=orjson.OPT_NON_STR_KEYS)
                except (TypeError, UnicodeDecodeError, orjson.JSONEncodeError) as exc:
                    errors.add(number, f"not representable as JSON: {exc}")
                    continue
                if b"\\u0000" in text_row:
                    errors.add(number, "NUL characters are not allowed in tasks")
                    continue
                yield number, text_row
            position[0] = int(size * number / total_rows)
    except Exception as exc:  # a corrupt page surfaces mid-iteration
        errors.add(number + 1, f"unreadable Parquet data: {exc}")


READERS = {"jsonl": read_jsonl, "csv": read_csv, "parquet": read_parquet}


def _copy_text(text: bytes) -> bytes:
    """A JSON text as a field of COPY's text format (backslash, tab and line breaks escaped)."""
    if b"\\" in text:
        text = text.replace(b"\\", b"\\\\")
    if b"\t" in text or b"\r" in text or b"\n" in text:
        text = text.replace(b"\t", b"\\t").replace(b"\r", b"\\r").replace(b"\n", b"\\n")
    return text


class TaskWriter:
    """Appends tasks to a split in batches, inside the caller's transaction. A context manager: on
    PostgreSQL one COPY stays open for the whole file and is fed a batch at a time, so the server works
    while the next batch is parsed (and memory stays bounded: a write blocks while the socket is full);
    leaving the block with an exception aborts the COPY."""

    def __init__(self, split_id: int, start_index: int) -> None:
        self.split_id = split_id
        self.next_index = start_index
        self.rows: list[bytes] = []
        self.written = 0
        self.postgres = connection.vendor == "postgresql"
        self.batch = BATCH
        self._stack = contextlib.ExitStack()
        self._copy = None

    def __enter__(self) -> TaskWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            self.flush()
        return bool(self._stack.__exit__(exc_type, exc, tb))

    def add(self, text: bytes) -> None:
        self.rows.append(text)
        if len(self.rows) >= self.batch:
            self.flush()

    def flush(self) -> None:
        if not self.rows:
            return
        table = Task._meta.db_table
        if self.postgres:
            if self._copy is None:
                # Django's own connection, so the COPY is part of the caller's transaction.
                cursor = self._stack.enter_context(connection.cursor()).cursor
                self._copy = self._stack.enter_context(cursor.copy(
                    f'COPY {table} (split_id, "index", spec) FROM STDIN'))
            prefix = f"{self.split_id}\t".encode()
            self._copy.write(b"".join(
                b"%s%d\t%s\n" % (prefix, self.next_index + offset, _copy_text(text))
                for offset, text in enumerate(self.rows)))
        else:
            with connection.cursor() as cursor:
                cursor.executemany(
                    f'INSERT INTO {table} (split_id, "index", spec) VALUES (%s, %s, %s)',
                    [(self.split_id, self.next_index + offset, text.decode())
                     for offset, text in enumerate(self.rows)],
                )
        self.next_index += len(self.rows)
        self.written += len(self.rows)
        self.rows = []


Sample = Callable[[int, int, bytes], None]  # (position in the file from 0, line or row number, task JSON)


def stream_into(*, path: Path, fmt: str, writer: TaskWriter, progress: Progress | None = None,
                quota: Quota | None = None, sample: Sample | None = None) -> int:
    """Reads ``path`` and writes its tasks; returns how many. After the first bad row nothing more is
    written, but reading goes on to report up to MAX_ERRORS bad rows in one IngestError (the caller's
    transaction then rolls back what was written). The first row past ``quota.room`` stops the read
    at once with TaskQuotaExceeded (rolled back the same way)."""
    errors = Errors()
    position = [0]
    last = time.monotonic()
    room = quota.room if quota is not None else None
    accepted = 0
    for line, text in READERS[fmt](path, errors, position):
        if errors:
            if errors.full:
                break
            continue
        accepted += 1
        if room is not None and accepted > room:
            raise TaskQuotaExceeded(quota.message)
        if sample is not None:
            sample(accepted - 1, line, text)
        writer.add(text)
        if progress is not None and not writer.rows:  # a batch has just been written
            now = time.monotonic()
            if now - last >= PROGRESS_EVERY_SECONDS:
                last = now
                progress(writer.written, position[0])
    if errors:
        count = f"{len(errors.items)}{'+' if errors.more else ''}"
        raise IngestError(f"{count} bad rows in the {fmt} file; no task was written.", errors.items)
    writer.flush()
    return writer.written
