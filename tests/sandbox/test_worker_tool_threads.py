"""The sandbox worker's threads for sync environment code (``ToolThreads``): calls run off the event
loop, concurrently up to the limit, and every outcome (a value, any exception) reaches the call that
waits for it; ``asyncio.to_thread`` shares the same threads."""

from __future__ import annotations

import asyncio
import threading

import pytest

from orsplatform.sandbox.worker_threads import ToolThreads


def test_sync_calls_run_off_the_loop_and_their_values_come_back_to_each_caller():
    async def main() -> None:
        pool = ToolThreads(4)
        loop = asyncio.get_running_loop()
        loop_thread = threading.get_ident()
        results = await asyncio.gather(*(pool.run(loop, lambda k=k: (k, threading.get_ident()), ()) for k in range(200)))
        assert [k for k, _ in results] == list(range(200))
        assert all(ident != loop_thread for _, ident in results)
        assert len({ident for _, ident in results}) <= 4

    asyncio.run(main())


def test_a_blocked_call_holds_one_thread_and_the_others_go_on():
    async def main() -> None:
        pool = ToolThreads(2)
        loop = asyncio.get_running_loop()
        release = threading.Event()
        stuck = pool.run(loop, release.wait, (30,))
        # The other thread serves these while the first waits.
        assert await asyncio.wait_for(asyncio.gather(*(pool.run(loop, pow, (2, k)) for k in range(50))), 10) == \
            [2 ** k for k in range(50)]
        assert not stuck.done()
        release.set()
        assert await asyncio.wait_for(stuck, 10) is True

    asyncio.run(main())


def test_every_exception_of_environment_code_reaches_its_caller():
    def exits():
        raise SystemExit(3)

    def stops():
        raise StopIteration("done")

    def fails():
        raise KeyError("txt")

    async def main() -> None:
        pool = ToolThreads(2)
        loop = asyncio.get_running_loop()
        with pytest.raises(SystemExit):
            await pool.run(loop, exits, ())
        with pytest.raises(RuntimeError, match="StopIteration"):
            await pool.run(loop, stops, ())
        with pytest.raises(KeyError, match="txt"):
            await pool.run(loop, fails, ())
        # A cancelled call's late answer is dropped, and the threads keep serving.
        release = threading.Event()
        late = pool.run(loop, release.wait, (30,))
        late.cancel()
        release.set()
        assert await pool.run(loop, sum, ([1, 2, 3],)) == 6

    asyncio.run(main())


def test_asyncio_to_thread_runs_on_the_same_threads_within_the_same_limit():
    async def main() -> None:
        pool = ToolThreads(3)
        loop = asyncio.get_running_loop()
        loop.set_default_executor(pool)
        idents = await asyncio.gather(*(asyncio.to_thread(lambda: threading.current_thread().name) for _ in range(60)))
        idents += await asyncio.gather(*(pool.run(loop, lambda: threading.current_thread().name, ()) for _ in range(60)))
        assert set(idents) <= {"ors-env_1", "ors-env_2", "ors-env_3"}
        assert await asyncio.to_thread(divmod, 7, 2) == (3, 1)
        with pytest.raises(ZeroDivisionError):
            await asyncio.to_thread(divmod, 1, 0)

    asyncio.run(main())
