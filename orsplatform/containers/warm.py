"""Versions kept warm: a started container per recently built or used container version, so the
version's first session (for any team) takes a running container instead of waiting for gVisor to
boot and the author's server to import (seconds; docs/containers.md gives the figures).

The gateway runs this loop beside its reaper when its sessions run in its own pool (the inline
executor): every ORS_CONTAINER_WARM_CHECK_SECONDS it asks the database which versions to keep warm
(containers/selectors.py, bounded by ORS_CONTAINER_WARM_VERSIONS, ORS_CONTAINER_WARM_PER_TEAM and
ORS_CONTAINER_WARM_IDLE_SECONDS) and the pool starts what is missing, one at a time, and stops what
is no longer wanted (sandbox/pool.py's spares). A build finishing is noticed at the next look; a
platform restart starts the same spares again; a spare taken by a session is replaced at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from django.conf import settings

from orsplatform.containers.selectors import versions_to_keep_warm
from orsplatform.executors.executor import Executor

log = logging.getLogger("orsplatform.containers")


def wanted_now() -> dict[str, str]:
    return versions_to_keep_warm(versions=settings.ORS_CONTAINER_WARM_VERSIONS,
                                 per_team=settings.ORS_CONTAINER_WARM_PER_TEAM,
                                 idle_seconds=settings.ORS_CONTAINER_WARM_IDLE_SECONDS)


async def keep_warm_forever(executor: Executor, run: Callable[..., Awaitable[Any]]) -> None:
    """``run``: a DB thread (the gateway store's)."""
    while True:
        try:
            executor.keep_warm(await run(wanted_now))
        except Exception as exc:  # the database away, say: the spares stay as they are
            log.warning("could not look up the versions to keep warm: %s", str(exc)[:200])
        await asyncio.sleep(settings.ORS_CONTAINER_WARM_CHECK_SECONDS)
