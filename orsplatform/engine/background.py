"""The gateway's background work: the reaper (idle sessions, lingering call results, stale pending
and deferred sids), the activity flush (last activity, readiness and prompts written in batches,
team slots renewed), and the shutdown that ends what this process holds.

A mixin of ``EpisodeGateway`` (engine/gateway.py): it works on the gateway's registries
(``sessions``, ``pending``, ``deferred``, ``calls``), its store, limits and executor; kept apart
because it runs on a timer, not on a request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine

from django.conf import settings

from orsplatform.containers.warm import keep_warm_forever
from orsplatform.engine.errors import StoreUnavailable
from orsplatform.episodes.models import Session

log = logging.getLogger("orsplatform.engine")


class GatewayBackground:
    def spawn(self, coro: Coroutine) -> asyncio.Task:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    def ensure_background(self) -> None:
        # Started on the first request, since not every server sends lifespan events.
        if self._reaper is None:
            self._reaper = asyncio.create_task(self._reap_forever())
            if not self.executor.shared and settings.ORS_CONTAINER_WARM_VERSIONS > 0:
                # Versions kept warm live in this process's pool (runner nodes: docs/containers.md).
                self._warmer = asyncio.create_task(keep_warm_forever(self.executor, self.store.run))

    async def _reap_forever(self) -> None:
        last_flush = time.monotonic()
        while True:
            await asyncio.sleep(min(settings.ORS_REAPER_INTERVAL_SECONDS, settings.ORS_ACTIVITY_FLUSH_SECONDS))
            try:
                await self.reap_once()
                if time.monotonic() - last_flush >= settings.ORS_ACTIVITY_FLUSH_SECONDS:
                    await self.flush_activity()
                    last_flush = time.monotonic()
            except StoreUnavailable as exc:  # an outage: one line per pass, not a traceback
                log.warning("reaper pass skipped: database unavailable (%s)", (str(exc).splitlines() or [""])[0][:200])
            except Exception:
                log.exception("reaper pass failed")

    async def reap_once(self) -> None:
        now = time.monotonic()
        timeout = settings.ORS_IDLE_TIMEOUT_SECONDS
        for live in list(self.sessions.values()):
            if live.adopted_at is not None and now - live.adopted_at > max(timeout, 60):
                self._drop_copy(live.sid)  # a cached copy nobody asked for in a long while
                continue
            if self.executor.shared:
                # Idle expiry is the beat's job (it sees every gateway's activity). A call running
                # here is activity: flushed like any other, so no session expires under a long call.
                if live.busy():
                    live.touch()
            elif now - live.last_activity > timeout and not live.busy():
                log.info("session %s expired after %.0f s idle", live.sid, now - live.last_activity)
                await self.end_session(live, Session.Status.EXPIRED)
        self.calls.expire(now, settings.ORS_RESULT_LINGER_SECONDS)
        for sid, pending in list(self.pending.items()):
            if now - pending.created > max(timeout, 600):
                self.pending.pop(sid, None)
        for sid, deferred in list(self.deferred.items()):
            if now - deferred.created > timeout:  # never bound: nothing was recorded or started
                self.deferred.pop(sid, None)
                if deferred.holds_slot:
                    await self.limits.release_session(deferred.team_id, sid)

    async def flush_activity(self) -> None:
        changed = [live for live in self.sessions.values()
                   if live.last_activity != live.flushed_activity or (live.ready_at and not live.ready_flushed)]
        prompts = {live.pk: live.prompt_unwritten for live in self.sessions.values()
                   if live.prompt_unwritten is not None}
        # Readiness only until it is written once (it never changes again). What is written is
        # taken now: activity or readiness that arrives while the write is in flight is flushed
        # next time, not marked as written (a session that became ready then stayed 'creating').
        activity = {live.pk: (live.last_activity_at(), None if live.ready_flushed else live.ready_at)
                    for live in changed}
        seen = [(live, live.last_activity, activity[live.pk][1] is not None) for live in changed]
        await self.store.flush_activity(activity, prompts)
        for live in self.sessions.values():
            if live.pk in prompts and live.prompt_unwritten is prompts[live.pk]:
                live.prompt_unwritten = None
        await self.limits.renew([(live.team_id, live.sid) for live in self.sessions.values()
                                 if live.team_id is not None]
                                + [(d.team_id, sid) for sid, d in self.deferred.items()
                                   if d.team_id is not None and d.holds_slot])
        for live, last_activity, ready_written in seen:
            live.flushed_activity = last_activity
            live.ready_flushed = live.ready_flushed or ready_written

    async def shutdown(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
        if self._warmer is not None:
            self._warmer.cancel()
        if self.executor.shared:
            # The sessions live on runner nodes and outlive this gateway; just record activity.
            await self.flush_activity()
            self.sessions.clear()
        for live in list(self.sessions.values()):
            try:
                await self.end_session(live, Session.Status.LOST)
            except Exception:
                log.exception("could not end session %s at shutdown", live.sid)
        await self.executor.close()
        await self.limits.close()
        await self.store.aclose()
        self.store.close()
