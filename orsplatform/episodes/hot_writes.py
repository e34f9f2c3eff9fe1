"""The hot path's writes, each declared once in its three forms.

A gateway group-commits concurrent writes: a batch runs each kind of hot write as one statement
(the ORM's many-rows form on SQLite and on the DB threads, or raw SQL through psycopg async on
PostgreSQL, see ``engine/pg_writer.py``), and a batch that fails is redone row by row (the single
form), so one bad row fails alone. The SQL forms take their columns from the models, so a field
added to ``Session`` or ``ToolCall`` reaches both paths at once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson
from django.db import connection, models
from django.utils import timezone

from orsplatform.episodes import services
from orsplatform.episodes.models import Session, ToolCall

# How the SQL form runs: one INSERT of many rows RETURNING ids, one INSERT of many rows, or one
# statement per row through executemany.
RETURNING, INSERT, EXECUTEMANY = "returning", "insert", "executemany"


@dataclass(frozen=True)
class SqlForm:
    sql: str
    params: list  # flat list (INSERT forms) or one tuple per row (EXECUTEMANY)
    mode: str


@dataclass(frozen=True)
class CopyForm:
    """A batch as PostgreSQL's COPY: the statement and its rows in COPY's text format."""

    sql: str
    data: bytes


@dataclass(frozen=True)
class HotWrite:
    name: str
    # The ORM's many-rows form: many(rows=[kwargs, ...]); returns a list (one value per row) when
    # per_row, else None.
    many: Callable[..., Any]
    per_row: bool
    # The raw-SQL form of a batch of rows (PostgreSQL); JSON values are wrapped by `json`.
    sql: Callable[[list[dict[str, Any]], Callable[[Any], Any]], SqlForm]
    # The COPY form of a batch of rows (PostgreSQL, append-only writes), or None. COPY cannot
    # update: a batch it refuses (a row already there, a value the column refuses) is redone with
    # the SQL form, whose upsert and row-by-row fallback decide.
    copy: Callable[[list[dict[str, Any]]], CopyForm] | None = None

    def single(self, **row: Any) -> Any:
        value = self.run(rows=[row])
        return value[0] if self.per_row else None

    def run(self, *, rows: list[dict[str, Any]]) -> Any:
        """The rows on Django's connection of this thread: on SQLite the SQL form (the ORM's
        bulk_create cost more CPU than the rest of the episode's write path), elsewhere the ORM's."""
        if connection.vendor != "sqlite":
            return self.many(rows=rows)
        form = self.sql(rows, _sqlite_json)
        with connection.cursor() as cursor:
            if form.mode == EXECUTEMANY:
                cursor.executemany(form.sql, [_sqlite_params(p) for p in form.params])
                return None
            cursor.execute(form.sql, _sqlite_params(form.params))
            # In insertion order, as Django's own bulk_create on SQLite relies on.
            return [r[0] for r in cursor.fetchall()] if form.mode == RETURNING else None


def _sqlite_json(value: Any) -> str:
    return orjson.dumps(value).decode()


def _sqlite_params(params: list | tuple) -> list:
    # The column's own text form: Django's adapt_datetimefield_value, which on a UTC connection is
    # the naive UTC time's str(); written out here because Django's reads settings for every value.
    adapt = _utc_text if connection.timezone is UTC else connection.ops.adapt_datetimefield_value
    return [adapt(v) if isinstance(v, datetime) else v for v in params]


def _utc_text(value: datetime) -> str:
    if value.tzinfo is not None:
        value = value.astimezone(UTC).replace(tzinfo=None)
    return str(value)


def _columns(model: type[models.Model], fields: dict[str, Any]) -> list[tuple[str, bool]]:
    """(column, is_json) for each field name (or attname) of `fields`, from the model."""
    out = []
    for name in fields:
        field = model._meta.get_field(name)
        out.append((field.column, isinstance(field, models.JSONField)))
    return out


def _insert(model: type[models.Model], rows: list[dict[str, Any]], json: Callable[[Any], Any],
            suffix: str) -> tuple[str, list]:
    columns = _columns(model, rows[0])
    params = [json(v) if is_json and v is not None else v
              for r in rows for (_, is_json), v in zip(columns, r.values(), strict=True)]
    row = "(" + ", ".join(["%s"] * len(columns)) + ")"
    sql = (f"INSERT INTO {model._meta.db_table} ({', '.join(c for c, _ in columns)}) "
           f"VALUES {', '.join([row] * len(rows))}{suffix}")
    return sql, params


def _session_create_sql(rows: list[dict[str, Any]], json: Callable[[Any], Any]) -> SqlForm:
    now = timezone.now()
    sql, params = _insert(Session, [services.session_fields(r, now) for r in rows], json, " RETURNING id")
    return SqlForm(sql, params, RETURNING)


def _tool_call_record_sql(rows: list[dict[str, Any]], json: Callable[[Any], Any]) -> SqlForm:
    updates = ", ".join(f"{ToolCall._meta.get_field(f).column} = EXCLUDED.{ToolCall._meta.get_field(f).column}"
                        for f in services.TOOL_CALL_RESULT_FIELDS)
    key = ", ".join(ToolCall._meta.get_field(f).column for f in ("task_id", "started_at"))
    sql, params = _insert(ToolCall, [services.tool_call_fields(r) for r in rows], json,
                          f" ON CONFLICT ({key}) DO UPDATE SET {updates}")
    return SqlForm(sql, params, INSERT)


_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def _copy_str(value: Any) -> str:
    """A text value in COPY's text format: backslash, tab and line ends escaped."""
    value = str(value)
    # Four substring tests cost less than a regex search, and almost no value has any of them.
    if "\\" in value or "\t" in value or "\n" in value or "\r" in value:
        return value.translate(_COPY_ESCAPES)
    return value


def _copy_json(value: Any) -> str:
    # orjson escapes every control character itself: only its backslashes need doubling.
    data = orjson.dumps(value)
    return (data.replace(b"\\", b"\\\\") if b"\\" in data else data).decode()


# The text of each UTC second written lately: isoformat() was a tenth of the writer's CPU per
# audit row (two times a row), and a gateway's rows share their seconds.
_SECONDS: dict[int, str] = {}


def _copy_datetime(value: datetime) -> str:
    if value.tzinfo is None:  # naive values are UTC, as Django's USE_TZ writes them
        value = value.replace(tzinfo=UTC)
    if value.tzinfo is not UTC:
        return value.isoformat()
    # The second as an integer from the fields themselves (UTC here): cheaper than timestamp().
    second = value.second + 60 * (value.minute + 60 * (value.hour + 24 * value.toordinal()))
    text = _SECONDS.get(second)
    if text is None:
        if len(_SECONDS) > 4096:
            _SECONDS.clear()
        text = _SECONDS[second] = value.replace(microsecond=0, tzinfo=None).isoformat()
    micro = value.microsecond
    # What isoformat() spells: no fraction when it is zero.
    return f"{text}.{micro:06d}+00:00" if micro else text + "+00:00"


def _copy_scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, float):
        return repr(value)  # exact, and inf/nan spelled as PostgreSQL reads them
    return _copy_str(value)


def _copy_encoder(field: models.Field) -> Callable[[Any], str]:
    if isinstance(field, models.JSONField):
        return _copy_json
    if isinstance(field, models.DateTimeField):
        return _copy_datetime
    return _copy_scalar


def copy_form(model: type[models.Model], rows: list[dict[str, Any]]) -> CopyForm:
    """COPY model (columns of rows[0]) FROM STDIN with the rows in COPY's text format (NULL is
    \\N). One encoder per column, chosen from its field once per batch."""
    fields = [model._meta.get_field(name) for name in rows[0]]
    encoders = [_copy_encoder(f) for f in fields]
    lines = ["\t".join(["\\N" if v is None else enc(v) for enc, v in zip(encoders, r.values(), strict=True)])
             for r in rows]
    return CopyForm(_copy_sql(model, rows[0]), ("\n".join(lines) + "\n").encode())


def _copy_sql(model: type[models.Model], row: dict[str, Any]) -> str:
    columns = ", ".join(model._meta.get_field(name).column for name in row)
    return f"COPY {model._meta.db_table} ({columns}) FROM STDIN"


# The audit row's columns in the order services.tool_call_fields gives them, which the encoder
# below spells out; a batch whose rows have other keys goes through copy_form instead.
_TOOL_CALL_KEYS = ("session_id", "task_id", "name", "input", "output", "status", "reward", "finished", "error",
                   "started_at", "finished_at")


def _tool_call_record_copy(rows: list[dict[str, Any]]) -> CopyForm:
    """copy_form(ToolCall, ...) written out for the audit row, byte for byte the same text: this
    runs for every call a gateway answers, and the generic form's per-value encoder dispatch and
    list building were most of the writer's CPU per row (docs/audit-log.md)."""
    fields = [services.tool_call_fields(r) for r in rows]
    if tuple(fields[0]) != _TOOL_CALL_KEYS:
        return copy_form(ToolCall, fields)
    scalar, text, json, when = _copy_scalar, _copy_str, _copy_json, _copy_datetime
    null = "\\N"
    lines = []
    for f in fields:
        session, output, reward, finished_at = f["session_id"], f["output"], f["reward"], f["finished_at"]
        lines.append("\t".join((
            str(session) if type(session) is int else scalar(session), text(f["task_id"]), text(f["name"]),
            json(f["input"]), null if output is None else json(output), text(f["status"]),
            null if reward is None else repr(reward) if type(reward) is float else scalar(reward),
            "t" if f["finished"] else "f", text(f["error"]),
            when(f["started_at"]), null if finished_at is None else when(finished_at))))
    lines.append("")
    return CopyForm(_copy_sql(ToolCall, fields[0]), "\n".join(lines).encode())


def _session_end_sql(rows: list[dict[str, Any]], json: Callable[[Any], Any]) -> SqlForm:
    return SqlForm(services.end_sql(), services.session_end_params(rows, json), EXECUTEMANY)


def _session_record_prompt_sql(rows: list[dict[str, Any]], json: Callable[[Any], Any]) -> SqlForm:
    return SqlForm(services.PROMPT_SQL, [(json(r["blocks"]), r["pk"]) for r in rows], EXECUTEMANY)


SESSION_CREATE = HotWrite("session_create", services.sessions_create, True, _session_create_sql)
TOOL_CALL_RECORD = HotWrite("tool_call_record", services.tool_calls_record, False, _tool_call_record_sql,
                            _tool_call_record_copy)
SESSION_END = HotWrite("session_end", services.sessions_end, False, _session_end_sql)
SESSION_RECORD_PROMPT = HotWrite("session_record_prompt", services.sessions_record_prompt, False,
                                 _session_record_prompt_sql)
