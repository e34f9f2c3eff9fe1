"""The gateway's PostgreSQL writer (orsplatform/engine/pg_writer.py): a batch of hot writes commits
together in one pipelined transaction, and a row the database refuses fails alone.

It runs against a PostgreSQL server whatever the suite's database is (tests/fixtures/server_database.py).
"""

from __future__ import annotations

import asyncio
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta, timezone
from types import SimpleNamespace

import psycopg
import pytest
from django.db import IntegrityError

from orsplatform.catalog.models import EnvironmentVersion
from orsplatform.engine.errors import Unstorable
from orsplatform.engine.pg_writer import PgWriter
from orsplatform.engine.store import WriteBatcher
from orsplatform.episodes import hot_writes, services
from orsplatform.episodes.models import Session, ToolCall
from orsplatform.teams.models import ApiKey


def run(writer: PgWriter, ops: list) -> list:
    async def go():
        try:
            return await writer.run(ops)
        finally:
            await writer.close()

    return asyncio.run(go())


@pytest.fixture
def new_session(live_db, server_database, owner):
    """Keyword arguments of ``hot_writes.SESSION_CREATE`` for a fresh episode of the owner's team."""
    version = EnvironmentVersion.objects.using(server_database.alias).select_related("environment").first()
    key = ApiKey.objects.using(server_database.alias).get(team_id=owner.team.pk)
    caller = SimpleNamespace(team_id=owner.team.pk, api_key_id=key.pk)
    env = SimpleNamespace(environment_id=version.environment_id, version_id=version.pk)

    def make() -> dict:
        return {"sid": uuid.uuid4().hex, "caller": caller, "env": env, "task_spec": {"q": "1+1"},
                "split": "train", "index": 0, "runner": ""}

    return make


def call_row(session_pk: int, name: str = "submit") -> dict:
    now = datetime.now(UTC)
    output = "2"
    return {"session_pk": session_pk, "task_id": uuid.uuid4().hex, "name": name, "input": {"answer": output},
            "result": {"ok": True, "output": {"blocks": [{"type": "text", "text": output}], "reward": 1.0,
                                              "finished": True}},
            "exception": "", "started_at": now, "finished_at": now}


def test_a_mixed_batch_of_hot_writes_commits_in_one_transaction(server_database, new_session):
    alias = server_database.alias
    existing = run(PgWriter(alias), [(hot_writes.SESSION_CREATE, new_session())])[0][1]

    results = run(PgWriter(alias), [
        (hot_writes.SESSION_CREATE, new_session()),
        (hot_writes.TOOL_CALL_RECORD, call_row(existing)),
        (hot_writes.SESSION_RECORD_PROMPT, {"pk": existing, "blocks": [{"type": "text", "text": "1+1?"}]}),
        (hot_writes.SESSION_CREATE, new_session()),
        (hot_writes.SESSION_END, {"pk": existing, "status": Session.Status.DELETED, "totals": None,
                                "last_activity_at": None, "ready_at": None}),
    ])

    assert [ok for ok, _ in results] == [True] * 5
    created = [results[0][1], results[3][1]]
    assert Session.objects.using(alias).filter(pk__in=created, status=Session.Status.CREATING).count() == 2
    ended = Session.objects.using(alias).get(pk=existing)
    assert ended.status == Session.Status.DELETED
    assert ended.prompt == [{"type": "text", "text": "1+1?"}]
    # Totals summed from the audit log by the same statement, after the call's row went in.
    assert (ended.calls, ended.total_reward, ended.finished) == (1, 1.0, True)


def test_a_row_the_database_refuses_fails_alone_and_the_rest_of_its_batch_is_written(
        server_database, new_session):
    alias = server_database.alias
    pk = run(PgWriter(alias), [(hot_writes.SESSION_CREATE, new_session())])[0][1]
    duplicate = new_session()
    run(PgWriter(alias), [(hot_writes.SESSION_CREATE, duplicate)])

    good, nul, again = call_row(pk), call_row(pk, name="sub\x00mit"), new_session()
    results = run(PgWriter(alias), [
        (hot_writes.TOOL_CALL_RECORD, good),
        (hot_writes.TOOL_CALL_RECORD, nul),  # PostgreSQL's text refuses NUL
        (hot_writes.SESSION_CREATE, duplicate),  # the same sid again: a unique violation
        (hot_writes.SESSION_CREATE, again),
    ])

    assert results[0] == (True, None)
    assert not results[1][0] and isinstance(results[1][1], Unstorable)
    assert not results[2][0] and isinstance(results[2][1], IntegrityError)
    assert results[3][0] and Session.objects.using(alias).filter(pk=results[3][1], sid=again["sid"]).exists()
    assert list(ToolCall.objects.using(alias).filter(session_id=pk).values_list("task_id", flat=True)) == [
        good["task_id"]]


def tricky_row(session_pk: int, n: int) -> dict:
    """A call whose values exercise COPY's text escapes: backslashes, tabs, line ends, quotes,
    non-ASCII text, a NULL reward and an error call."""
    row = call_row(session_pk)
    text = f"line {n}\n\ttab \\ back\\slash \r\"quoted\" ünïcødé ☃ \\N"
    row["name"] = f"tool\\{n}\t"
    row["input"] = {"text": text, "n": n, "nested": [None, True, 1.5, {"k": text}]}
    if n % 2:
        row["result"] = {"ok": False, "error": text}
        row["exception"] = text
    return row


def stored(alias: str, task_ids: list[str]) -> list[tuple]:
    fields = ["task_id", "name", "input", "status", "output", "reward", "finished", "error", "started_at",
              "finished_at", "session_id"]
    return sorted(ToolCall.objects.using(alias).filter(task_id__in=task_ids).values_list(*fields))


def test_a_batch_of_calls_copied_is_stored_exactly_as_the_insert_stores_it(
        server_database, new_session, monkeypatch):
    from orsplatform.engine import pg_writer

    alias = server_database.alias
    pk = run(PgWriter(alias), [(hot_writes.SESSION_CREATE, new_session())])[0][1]
    rows = [tricky_row(pk, n) for n in range(8)]
    answered_by_copy = []
    copied_form = PgWriter._copied

    async def spy(self, conn, ops):
        answered_by_copy.append(await copied_form(self, conn, ops))
        return answered_by_copy[-1]

    monkeypatch.setattr(PgWriter, "_copied", spy)
    copied = run(PgWriter(alias), [(hot_writes.TOOL_CALL_RECORD, r) for r in rows])
    assert copied == [(True, None)] * 8
    assert answered_by_copy == [copied]  # by COPY itself, not its fallback
    by_copy = stored(alias, [r["task_id"] for r in rows])
    ToolCall.objects.using(alias).filter(session_id=pk).delete()

    monkeypatch.setattr(pg_writer, "COPY_MIN_ROWS", 10**6)  # the INSERT form, for the reference
    inserted = run(PgWriter(alias), [(hot_writes.TOOL_CALL_RECORD, r) for r in rows])
    assert inserted == [(True, None)] * 8
    assert by_copy == stored(alias, [r["task_id"] for r in rows])
    assert len(by_copy) == 8


def test_a_copied_batch_with_a_call_already_recorded_upserts_and_a_refused_row_fails_alone(
        server_database, new_session):
    alias = server_database.alias
    pk = run(PgWriter(alias), [(hot_writes.SESSION_CREATE, new_session())])[0][1]
    swept = call_row(pk)
    swept["result"], swept["exception"] = None, "Runner lost."  # what the sweeper wrote first
    run(PgWriter(alias), [(hot_writes.TOOL_CALL_RECORD, swept)])

    again = dict(swept, result=call_row(pk)["result"], exception="")  # the gateway's own record of it
    fresh = [call_row(pk) for _ in range(5)]
    nul = call_row(pk, name="sub\x00mit")
    other = new_session()
    results = run(PgWriter(alias), [(hot_writes.TOOL_CALL_RECORD, r) for r in [again, *fresh, nul]]
                  + [(hot_writes.SESSION_CREATE, other)])

    assert [ok for ok, _ in results] == [True] * 6 + [False, True]
    assert isinstance(results[6][1], Unstorable)
    assert ToolCall.objects.using(alias).get(task_id=swept["task_id"]).status == ToolCall.Status.OK
    assert ToolCall.objects.using(alias).filter(session_id=pk).count() == 6
    assert Session.objects.using(alias).filter(pk=results[7][1], sid=other["sid"]).exists()


def test_a_mixed_batch_with_copied_calls_commits_them_with_its_other_writes(server_database, new_session):
    alias = server_database.alias
    pk = run(PgWriter(alias), [(hot_writes.SESSION_CREATE, new_session())])[0][1]
    calls = [call_row(pk) for _ in range(6)]
    results = run(PgWriter(alias), [
        *[(hot_writes.TOOL_CALL_RECORD, c) for c in calls[:3]],
        (hot_writes.SESSION_CREATE, new_session()),
        *[(hot_writes.TOOL_CALL_RECORD, c) for c in calls[3:]],
        (hot_writes.SESSION_RECORD_PROMPT, {"pk": pk, "blocks": [{"type": "text", "text": "1+1?"}]}),
    ])
    assert [ok for ok, _ in results] == [True] * 8
    assert isinstance(results[3][1], int) and Session.objects.using(alias).filter(pk=results[3][1]).exists()
    assert ToolCall.objects.using(alias).filter(session_id=pk).count() == 6
    assert Session.objects.using(alias).get(pk=pk).prompt == [{"type": "text", "text": "1+1?"}]


def test_a_batch_of_calls_alone_is_one_copy_and_a_refused_one_is_redone_by_the_insert(
        server_database, new_session, monkeypatch):
    # Calls alone go in by one COPY in autocommit (no BEGIN/COMMIT); a COPY the database refuses
    # committed nothing, and the INSERT form then upserts the row already there and fails the bad one.
    alias = server_database.alias
    pk = run(PgWriter(alias), [(hot_writes.SESSION_CREATE, new_session())])[0][1]
    swept = call_row(pk)
    swept["result"], swept["exception"] = None, "Runner lost."
    run(PgWriter(alias), [(hot_writes.TOOL_CALL_RECORD, swept)])
    copies = []
    copy = PgWriter._copy

    async def spy(conn, form):
        copies.append(conn.info.transaction_status)
        await copy(conn, form)

    monkeypatch.setattr(PgWriter, "_copy", staticmethod(spy))
    fresh = [call_row(pk) for _ in range(5)]
    assert run(PgWriter(alias), [(hot_writes.TOOL_CALL_RECORD, r) for r in fresh]) == [(True, None)] * 5
    assert copies == [psycopg.pq.TransactionStatus.IDLE]  # not inside a transaction of its own making
    assert ToolCall.objects.using(alias).filter(session_id=pk).count() == 6

    again = dict(swept, result=call_row(pk)["result"], exception="")
    more = [call_row(pk) for _ in range(4)]
    nul = call_row(pk, name="sub\x00mit")
    results = run(PgWriter(alias), [(hot_writes.TOOL_CALL_RECORD, r) for r in [again, *more, nul]])
    assert [ok for ok, _ in results] == [True] * 5 + [False]
    assert isinstance(results[5][1], Unstorable)
    assert ToolCall.objects.using(alias).get(task_id=swept["task_id"]).status == ToolCall.Status.OK
    assert ToolCall.objects.using(alias).filter(session_id=pk).count() == 10


def test_the_audit_rows_copy_text_is_the_generic_copy_forms_byte_for_byte():
    # The written-out encoder of the audit row against copy_form's per-column one: naive, UTC and
    # other-zone times, whole seconds, a missing finish, integer and missing rewards, escapes.
    base = datetime(2026, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC)
    rows = []
    for n in range(40):
        row = tricky_row(n + 1, n)
        row["started_at"] = base + timedelta(microseconds=n)
        row["finished_at"] = (base + timedelta(seconds=n)).replace(microsecond=0) if n % 3 else None
        if n % 5 == 0:
            row["started_at"] = row["started_at"].astimezone(timezone(timedelta(hours=-3)))
        if n % 7 == 0:
            row["started_at"] = row["started_at"].replace(tzinfo=None)
        if n % 4 == 0 and row["result"]["ok"]:
            row["result"]["output"]["reward"] = n
        rows.append(row)
    fields = [services.tool_call_fields(r) for r in rows]
    assert hot_writes.TOOL_CALL_RECORD.copy(rows) == hot_writes.copy_form(ToolCall, fields)


async def test_a_call_is_acknowledged_only_once_its_row_is_visible_to_another_connection(
        server_database, new_session):
    # The group commit's contract on PostgreSQL: each call's future resolves after the commit of
    # its batch, so a row acknowledged is already in the table for any other connection.
    from asgiref.sync import sync_to_async

    alias = server_database.alias
    writers = [PgWriter(alias), PgWriter(alias)]
    pk = (await writers[0].run([(hot_writes.SESSION_CREATE, await sync_to_async(new_session)())]))[0][1]
    pool = ThreadPoolExecutor(max_workers=1)
    batcher = WriteBatcher(pool, flushers=1, pg_writers=writers)
    reader = PgWriter(alias)
    seen = []

    async def record(row: dict) -> None:
        await batcher.enqueue(hot_writes.TOOL_CALL_RECORD, row)
        seen.append(await reader.fetch_value("SELECT count(*) FROM episodes_toolcall WHERE task_id = %s",
                                             (row["task_id"],)))

    try:
        # Its connection opened first: the 200 reads below then share it rather than each open one.
        assert await reader.fetch_value("SELECT 1", ()) == 1
        await asyncio.gather(*[record(call_row(pk)) for _ in range(200)])
    finally:
        batcher.stop()
        await batcher.aclose()
        await reader.close()
        pool.shutdown()
    assert seen == [1] * 200


def test_many_readers_at_once_on_a_cold_writer_share_one_connection(server_database):
    """A cold gateway under load: every coroutine asks before the connection exists."""
    writer = PgWriter(server_database.alias)

    async def go() -> set:
        try:
            pids = await asyncio.gather(*[writer.fetch_value("SELECT pg_backend_pid()", ()) for _ in range(40)])
            return set(pids)
        finally:
            await writer.close()

    assert len(asyncio.run(go())) == 1
