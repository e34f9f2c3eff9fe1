"""Fold the tool-call audit log and ended sessions into the analytics rollups now (beat does it every 30 s)."""

from __future__ import annotations

import time

from django.core.management.base import BaseCommand

from orsplatform.analytics.services import (
    session_rollup_rebuild,
    session_rollup_run,
    settle_seconds,
    tool_call_rollup_rebuild,
    tool_call_rollup_run,
)


class Command(BaseCommand):
    help = ("Fold new tool calls and ended sessions into the analytics rollups; --rebuild starts again "
            "from the first call and session.")

    def add_arguments(self, parser) -> None:
        parser.add_argument("--rebuild", action="store_true", help="drop the rollups and fold the whole audit log")
        parser.add_argument("--batch-size", type=int, default=20_000)
        parser.add_argument("--settle", type=float, default=None,
                            help="seconds a new id must have been seen before it is folded (0 when nothing "
                                 "is writing, e.g. on a restored copy)")

    def handle(self, *args, rebuild: bool, batch_size: int, settle: float | None, **options) -> None:
        settle = settle_seconds() if settle is None else settle
        if rebuild:
            tool_call_rollup_rebuild()
            session_rollup_rebuild()
        started = time.perf_counter()
        folded = tool_call_rollup_run(batch_size=batch_size, settle=settle)
        if settle > 0:
            # Ids seen just now may only be folded once they have settled (see services): wait once.
            time.sleep(settle)
            folded += tool_call_rollup_run(batch_size=batch_size, settle=settle)
        sessions = session_rollup_run()
        self.stdout.write(f"folded {folded} tool calls and {sessions} sessions in "
                          f"{time.perf_counter() - started:.1f} s")
