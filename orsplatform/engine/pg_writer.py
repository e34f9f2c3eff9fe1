"""The hot path's writes (and its one uncached read, a task's spec) on PostgreSQL, on the event loop.

On PostgreSQL a write is a network round trip or three; run on a worker thread, each of them also
has to win the GIL back from a busy event loop, and that hand-off, not the database, was most of
the latency of /create, /call and /delete (see docs/benchmarks-history.md). Here one psycopg AsyncConnection
runs a batch of episode inserts, audit-row upserts and episode ends in one transaction, awaiting
the database without a thread. The statements come from the hot-write registry
(``episodes/hot_writes.py``), beside the ORM forms; everything else goes through the ORM on the DB
threads.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson
import psycopg
from django.db import IntegrityError, connections
from psycopg.types.json import Jsonb

from orsplatform.engine.errors import StoreUnavailable, Unstorable
from orsplatform.episodes.hot_writes import EXECUTEMANY, RETURNING, CopyForm, HotWrite

log = logging.getLogger(__name__)

# From this many rows of one append-only write in a batch, they go in by COPY: a 500-row INSERT
# cost the writer 3-4x the CPU of COPY's text rows (bench/audit_ingest.py); a row or two go with
# the batch's other statements in its pipeline.
COPY_MIN_ROWS = 4

# Keys of DATABASES OPTIONS that Django's backend consumes itself; the rest are libpq parameters.
DJANGO_ONLY_OPTIONS = {"assume_role", "isolation_level", "pool", "server_side_binding"}


def _dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


def _jsonb(value: Any) -> Jsonb:
    return Jsonb(value, dumps=_dumps)


class PgWriter:
    def __init__(self, alias: str = "default") -> None:
        self._alias = alias
        self._conn: psycopg.AsyncConnection | None = None
        # One connection however many coroutines ask at once: on a cold gateway under load every
        # reader and the writer would otherwise each open one (and all but the last leak).
        self._opening: asyncio.Lock | None = None

    async def _connection(self) -> psycopg.AsyncConnection:
        if self._conn is not None and not self._conn.closed:
            return self._conn
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            return await self._open()

    async def _open(self) -> psycopg.AsyncConnection:
        if self._conn is None or self._conn.closed:
            # The database as Django sees it now (tests rename it to the test database),
            # with its libpq options too (DATABASE_URL's ?connect_timeout=, ?sslmode=, ...), as
            # Django's own connections have them: without connect_timeout, a database that accepts
            # connections but does not answer held every hot write (and its request) forever.
            s = connections[self._alias].settings_dict
            options = {k: v for k, v in (s.get("OPTIONS") or {}).items() if k not in DJANGO_ONLY_OPTIONS}
            self._conn = await psycopg.AsyncConnection.connect(
                dbname=s["NAME"], user=s.get("USER") or None, password=s.get("PASSWORD") or None,
                host=s.get("HOST") or None, port=s.get("PORT") or None, **options, autocommit=True)
        return self._conn

    async def run(self, ops: list[tuple[HotWrite, dict]]) -> list[tuple[bool, Any]]:
        """Results in the WriteBatcher's form: (True, value) or (False, exception), per op."""
        try:
            conn = await self._connection()
            copied = await self._copied(conn, ops)
            if copied is not None:
                return copied
            if len({write for write, _ in ops}) == 1:
                # One kind of write is one statement (rows of one INSERT, or one UPDATE per row
                # when executemany has a single row), atomic by itself: sent alone in autocommit,
                # without the pipeline's and the transaction's extra messages. Small batches are
                # the rule behind several gateways, where this halved the writer's CPU per op.
                single = await self._single(conn, ops)
                if single is not None:
                    return single
            # Pipeline mode: BEGIN, the statements and COMMIT leave in one write and their results
            # come back together, instead of a round trip each (a batch of one op was three).
            async with conn.pipeline(), conn.transaction():
                return await self._grouped(conn, ops)
        except (psycopg.errors.IntegrityError, psycopg.errors.DataError):
            pass  # one bad row: redo them one by one below, so it fails alone
        except psycopg.Error as exc:
            await self.close()
            return [(False, StoreUnavailable(str(exc)))] * len(ops)
        results: list[tuple[bool, Any]] = []
        for op in ops:
            try:
                async with conn.pipeline(), conn.transaction():
                    results.extend(await self._grouped(conn, [op]))
            except psycopg.errors.IntegrityError as exc:
                results.append((False, IntegrityError(str(exc))))
            except psycopg.errors.DataError as exc:
                results.append((False, Unstorable(str(exc))))
            except psycopg.Error as exc:
                await self.close()
                results.append((False, StoreUnavailable(str(exc))))
        return results

    async def _copied(self, conn: psycopg.AsyncConnection, ops: list[tuple[HotWrite, dict]]
                      ) -> list[tuple[bool, Any]] | None:
        """The batch with its append-only rows sent by COPY, in one transaction with the batch's
        other statements (pipelined), committed before any of them is answered. None when no write
        has rows enough, or when the database refused the COPY (a row already there, a value a
        column refuses): the caller then runs the batch as SQL, whose upsert and row-by-row
        fallback decide; nothing of the refused attempt was committed."""
        copies: dict[HotWrite, list[int]] = {}
        for i, (write, _) in enumerate(ops):
            if write.copy is not None:
                copies.setdefault(write, []).append(i)
        copies = {w: idx for w, idx in copies.items() if len(idx) >= COPY_MIN_ROWS}
        if not copies:
            return None
        try:
            forms = [write.copy([ops[i][1] for i in idx]) for write, idx in copies.items()]
        except (TypeError, ValueError):  # a value COPY's text cannot carry (a lone surrogate)
            return None
        copied = {i for idx in copies.values() for i in idx}
        rest = [op for i, op in enumerate(ops) if i not in copied]
        results: list[tuple[bool, Any]] = [(True, None)] * len(ops)
        if len(forms) == 1 and not rest:
            # The common batch, audit rows alone: one COPY in autocommit is one transaction by
            # itself, committed (and flushed, synchronous_commit) before its CommandComplete comes
            # back, without BEGIN's and COMMIT's two more round trips.
            try:
                await self._copy(conn, forms[0])
            except (psycopg.errors.IntegrityError, psycopg.errors.DataError):
                return None
            return results
        try:
            async with conn.transaction():
                for form in forms:
                    await self._copy(conn, form)
                if rest:
                    async with conn.pipeline():
                        rest_results = await self._grouped(conn, rest)
                    rest_indexes = [i for i in range(len(ops)) if i not in copied]
                    for i, result in zip(rest_indexes, rest_results, strict=True):
                        results[i] = result
        except (psycopg.errors.IntegrityError, psycopg.errors.DataError):
            return None
        return results

    @staticmethod
    async def _copy(conn: psycopg.AsyncConnection, form: CopyForm) -> None:
        async with conn.cursor() as cursor, cursor.copy(form.sql) as copy:
            await copy.write(form.data)

    async def _single(self, conn: psycopg.AsyncConnection, ops: list[tuple[HotWrite, dict]]
                      ) -> list[tuple[bool, Any]] | None:
        """The batch as one statement in autocommit, or None when it is not one statement."""
        form = ops[0][0].sql([kwargs for _, kwargs in ops], _jsonb)
        if form.mode == EXECUTEMANY:
            if len(form.params) != 1:
                return None
            sql, params = form.sql, form.params[0]
        else:
            sql, params = form.sql, form.params
        async with conn.cursor() as cursor:
            await cursor.execute(sql, params)
            if form.mode == RETURNING:
                return [(True, r[0]) for r in await cursor.fetchall()]
        return [(True, None)] * len(ops)

    async def _grouped(self, conn: psycopg.AsyncConnection, ops: list[tuple[HotWrite, dict]]
                       ) -> list[tuple[bool, Any]]:
        results: list[tuple[bool, Any] | None] = [None] * len(ops)
        groups: dict[HotWrite, list[int]] = {}
        for i, (write, _) in enumerate(ops):
            groups.setdefault(write, []).append(i)
        async with conn.cursor() as cursor:
            for write, indexes in groups.items():
                form = write.sql([ops[i][1] for i in indexes], _jsonb)
                if form.mode == EXECUTEMANY:
                    await cursor.executemany(form.sql, form.params)
                else:
                    await cursor.execute(form.sql, form.params)
                values = [r[0] for r in await cursor.fetchall()] if form.mode == RETURNING else None
                for n, i in enumerate(indexes):
                    results[i] = (True, values[n] if values is not None else None)
        return results  # type: ignore[return-value]

    async def fetch_value(self, sql: str, params: tuple) -> Any:
        """The first column of the first row (None without one), read on the event loop; a lost
        connection is reopened by the next read."""
        try:
            conn = await self._connection()
            async with conn.cursor() as cursor:
                await cursor.execute(sql, params)
                row = await cursor.fetchone()
        except psycopg.Error as exc:
            await self.close()
            raise StoreUnavailable(str(exc)) from exc
        return None if row is None else row[0]

    async def fetch_rows(self, sql: str, params: tuple) -> list[tuple]:
        """Every row, read on the event loop (as fetch_value)."""
        try:
            conn = await self._connection()
            async with conn.cursor() as cursor:
                await cursor.execute(sql, params)
                return list(await cursor.fetchall())
        except psycopg.Error as exc:
            await self.close()
            raise StoreUnavailable(str(exc)) from exc

    async def close(self) -> None:
        if self._conn is not None:
            try:
                await self._conn.close()
            except Exception:
                pass
            self._conn = None
