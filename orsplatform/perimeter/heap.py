"""The server process's garbage collector, set for many long-lived connections.

CPython's full collection (its oldest generation) walks every object the collector tracks, and
holds the event loop while it does. Held sockets are many such objects (a socket, its consumer,
session, protocol objects and tasks: about 165 each), and they live for the socket's life, so a
full collection frees next to nothing. Measured with 8,192 OpenEnv sockets held (about 1.5 M
objects): a full collection every 3 to 10 s, 1.3 to 2 s each, collecting nothing — the periodic
stall every socket's step then waits for.

Two settings make those collections rare and short:
- The heap the process holds once the application is loaded (Django, every module, the URLconf,
  settings: some 200,000 objects) is frozen (``gc.freeze``): it is never garbage, so no collection
  walks it again. Objects frozen are still freed by reference counting; only a reference cycle
  among them would stay, and the import-time heap has none that matter.
- The youngest generation is larger (ORS_GC_YOUNG_THRESHOLD objects instead of CPython's 700): a
  step's short-lived objects (its frames, futures, tasks, messages) are freed by reference
  counting before a young collection sees them, so far fewer are promoted into the oldest
  generation, whose growth is what triggers a full collection (CPython runs one once the objects
  promoted since the last reach a quarter of the oldest generation). A young collection walks only
  its own generation, so a larger one costs milliseconds, not the whole heap.
"""

from __future__ import annotations

import gc
import logging

logger = logging.getLogger("orsplatform.perimeter")


def heap_settle(*, freeze: bool, young_threshold: int) -> None:
    """Called once the application is loaded (asgi.py), before the first connection."""
    if young_threshold > 0:
        _, middle, old = gc.get_threshold()
        gc.set_threshold(young_threshold, middle, old)
    if freeze:
        # Garbage of the start-up (import-time temporaries in cycles) goes first, so none is frozen.
        gc.collect()
        gc.freeze()
        logger.info("garbage collector: %d start-up objects frozen, thresholds %s", gc.get_freeze_count(),
                    gc.get_threshold())
