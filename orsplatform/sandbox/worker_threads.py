"""The threads a sandbox worker runs sync environment code in (ToolThreads): its hop from the event
loop to them and back.

Imported by the worker inside its sandbox (bound there by binding.py): standard library only.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import queue
import threading
from typing import Any


class ToolThreads(concurrent.futures.ThreadPoolExecutor):
    """The worker's threads for sync environment code: up to ORS_TOOL_THREADS, started as needed.

    `run` is Host.run's hop, leaner than ``run_in_executor``: no concurrent Future chained to an
    asyncio one per call, and the answers of calls that finish close together wake the event loop
    once (profiled, the executor's machinery was the biggest part of a small sync tool's cost in
    the worker). `submit` is the executor API, for ``asyncio.to_thread`` (the openreward SDK's sync
    tools): the same threads, so the limit is one for both. A ThreadPoolExecutor by type only, as
    ``loop.set_default_executor`` requires; none of its own machinery is used."""

    def __init__(self, size: int) -> None:
        super().__init__(max_workers=max(1, size))
        self._size = max(1, size)
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._guard = threading.Lock()
        self._waiting = threading.Semaphore(0)  # one release per thread waiting for work
        self._started = 0
        self._done: list[tuple[asyncio.Future, bool, Any]] = []
        self._waking = False

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._put((None, future, functools.partial(fn, **kwargs) if kwargs else fn, args))
        return future

    def run(self, loop: asyncio.AbstractEventLoop, fn: Any, args: tuple) -> asyncio.Future:
        future = loop.create_future()
        self._put((loop, future, fn, args))
        return future

    def _put(self, item: tuple) -> None:
        self._jobs.put(item)
        if self._waiting.acquire(blocking=False):
            return  # a waiting thread takes it
        with self._guard:
            if self._started >= self._size:
                return  # every thread is busy: it waits its turn
            self._started += 1
            n = self._started
        threading.Thread(target=self._serve, name=f"ors-env_{n}", daemon=True).start()

    def _serve(self) -> None:
        while True:
            loop, future, fn, args = self._jobs.get()
            if loop is None:
                if future.set_running_or_notify_cancel():
                    try:
                        future.set_result(fn(*args))
                    except BaseException as exc:  # environment code may raise anything
                        future.set_exception(exc)
            else:
                try:
                    done = (future, True, fn(*args))
                except BaseException as exc:  # handed to the awaiting call (SystemExit included)
                    done = (future, False, exc)
                with self._guard:
                    self._done.append(done)
                    wake, self._waking = not self._waking, True
                if wake:
                    with contextlib.suppress(RuntimeError):  # the loop closed: the worker is ending
                        loop.call_soon_threadsafe(self._deliver)
            del loop, future, fn, args
            self._waiting.release()

    def _deliver(self) -> None:
        with self._guard:
            done, self._done, self._waking = self._done, [], False
        for future, ok, value in done:
            if future.done():  # its call was cancelled
                continue
            if ok:
                future.set_result(value)
            elif isinstance(value, StopIteration):  # a Future refuses it (it would end a generator)
                future.set_exception(RuntimeError(f"StopIteration: {value}"))
            else:
                future.set_exception(value)
