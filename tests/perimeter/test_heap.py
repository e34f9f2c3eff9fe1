"""The server's garbage-collector settings (orsplatform/perimeter/heap.py), applied when a server
starts (the lifespan's startup)."""

from __future__ import annotations

import asyncio
import gc

import pytest

from orsplatform.asgi import build_application
from orsplatform.perimeter.heap import heap_settle


@pytest.fixture
def restored_gc():
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


def test_it_freezes_the_start_up_heap_and_enlarges_the_young_generation(restored_gc):
    kept = {"a": [1, 2, 3]}  # an object the process keeps: frozen, never walked again
    heap_settle(freeze=True, young_threshold=50_000)
    assert gc.get_freeze_count() > 1000
    assert gc.get_threshold()[0] == 50_000
    assert all(o is not kept for o in gc.get_objects())  # frozen: in no generation a collection walks


def test_zero_and_false_leave_cpython_as_it_is(restored_gc):
    before = gc.get_threshold()
    heap_settle(freeze=False, young_threshold=0)
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == before


async def test_a_starting_server_settles_the_heap_before_it_answers_the_startup(restored_gc, settings, ors_app):
    settings.ORS_GC_YOUNG_THRESHOLD = 12_345
    app = build_application(ors_app)
    started = asyncio.Event()
    messages = [{"type": "lifespan.startup"}]

    async def receive() -> dict:
        if messages:
            return messages.pop()
        await asyncio.Event().wait()  # the server runs until it is stopped
        raise AssertionError("unreachable")

    async def send(message: dict) -> None:
        assert message["type"] == "lifespan.startup.complete"
        started.set()

    lifespan = asyncio.create_task(app({"type": "lifespan"}, receive, send))
    await asyncio.wait_for(started.wait(), 30)
    lifespan.cancel()
    assert gc.get_threshold()[0] == 12_345 and gc.get_freeze_count() > 1000
