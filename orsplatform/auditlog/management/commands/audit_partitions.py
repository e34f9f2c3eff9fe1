"""The audit log's partitions on PostgreSQL (docs/audit-log.md).

    manage.py audit_partitions status            # each partition: rows (estimate) and size
    manage.py audit_partitions ensure [--ahead N] # the daily partitions up to N days ahead
    manage.py audit_partitions migrate-legacy [--batch 10000]
        # an upgraded installation's rows, moved into the partitions in short batches; resumable
"""

from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from orsplatform.auditlog import partitions


class Command(BaseCommand):
    help = "Show, create ahead, or fill from an upgraded installation the audit log's daily partitions."

    def add_arguments(self, parser) -> None:
        parser.add_argument("action", choices=["status", "ensure", "migrate-legacy"])
        parser.add_argument("--ahead", type=int, default=None, help="days ahead (ensure)")
        parser.add_argument("--batch", type=int, default=10_000, help="rows per transaction (migrate-legacy)")

    def handle(self, *args, action: str, ahead: int | None, batch: int, **options) -> None:
        if not partitions.enabled():
            self.stdout.write("The audit log is one table on this database (partitions are PostgreSQL's).")
            return
        if action == "status":
            for parent in partitions.TABLES.values():
                for p in partitions.partitions_list(parent):
                    self.stdout.write(f"{p.table}\t{p.day or 'default'}\t~{p.rows_estimate} rows\t{p.bytes} bytes")
        elif action == "ensure":
            days = ahead if ahead is not None else settings.ORS_AUDIT_PARTITIONS_AHEAD_DAYS
            for name in partitions.partitions_ensure_ahead(ahead_days=days):
                self.stdout.write(f"created {name}")
        else:
            if batch < 1:
                raise CommandError("--batch must be at least 1")
            total = 0
            while True:
                progress = partitions.legacy_move(batch=batch)
                total += progress.moved
                if progress.done:
                    break
                self.stdout.write(f"moved {total} rows")
            self.stdout.write(f"done: {total} rows moved, the legacy table dropped")
