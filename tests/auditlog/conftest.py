"""Days of calls of two teams in the server database, for the retention and archive tests."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

import pytest
from django.db import connections

from orsplatform.auditlog import partitions
from orsplatform.auditlog.models import ArchivedPeriod
from orsplatform.auditlog.store import DirectoryStore
from orsplatform.catalog.models import EnvironmentVersion
from orsplatform.episodes.models import Session, ToolCall
from orsplatform.teams.models import Team

OLD_DAYS = 10  # the archived day is this many days before today


@dataclass
class Seeded:
    alias: str
    day: date  # the old day both teams have calls on
    acme: Team
    globex: Team
    sessions: dict[str, list[Session]]  # team slug -> its sessions on that day
    store: DirectoryStore

    @property
    def partition(self) -> str:
        return partitions.partition_name(partitions.TOOL_CALLS, self.day)

    def calls(self, slug: str) -> list[tuple]:
        """The team's calls of that day as stored, in order."""
        return list(ToolCall.objects.using(self.alias).filter(session__in=self.sessions[slug])
                    .order_by("id").values_list("id", "session_id", "task_id", "name", "input", "status", "output",
                                                "reward", "finished", "error", "started_at", "finished_at"))

    def rows_in_partition(self) -> dict[int, int]:
        with connections[self.alias].cursor() as cursor:
            cursor.execute(f"SELECT s.team_id, COUNT(*) FROM {self.partition} t JOIN episodes_session s"
                           " ON s.id = t.session_id GROUP BY 1")
            return dict(cursor.fetchall())


def _sessions(alias: str, team: Team, version: EnvironmentVersion, day: date) -> list[Session]:
    out = []
    for n in range(2):
        created = datetime(day.year, day.month, day.day, 10 + n, tzinfo=UTC)
        session = Session.objects.using(alias).create(
            sid=f"{team.slug}-{uuid.uuid4().hex}", team=team, environment_id=version.environment_id,
            version=version, task_spec={"q": n}, split="train", task_index=n, status="deleted", calls=3,
            total_reward=1.0, finished=True, created_at=created, last_activity_at=created,
            ended_at=created + timedelta(minutes=1))
        ToolCall.objects.using(alias).bulk_create([
            ToolCall(session=session, task_id=uuid.uuid4().hex, name="submit" if k == 2 else "move",
                     input={"step": k, "text": "tab\there \\ ünï"}, status="ok",
                     output={"ok": True, "output": {"blocks": [{"type": "text", "text": f"step {k}"}],
                                                    "reward": 1.0 if k == 2 else 0.0, "finished": k == 2}},
                     reward=1.0 if k == 2 else 0.0, finished=k == 2, error="",
                     started_at=created + timedelta(seconds=k), finished_at=created + timedelta(seconds=k, milliseconds=5))
            for k in range(3)])
        out.append(session)
    return out


@pytest.fixture
def seeded(server_database, owner, tmp_path, settings) -> Seeded:
    alias = server_database.alias
    settings.ORS_AUDIT_ARCHIVE_DIR = tmp_path / "var-archive"
    settings.ORS_AUDIT_ARCHIVE_URL = str(tmp_path / "archive")  # the store the seeded tests archive into
    day = datetime.now(UTC).date() - timedelta(days=OLD_DAYS)
    partitions.partition_ensure(partitions.TOOL_CALLS, day, using=alias)
    acme = Team.objects.using(alias).get(pk=owner.team.pk)
    globex = Team.objects.using(alias).create(slug=f"globex-{uuid.uuid4().hex[:6]}", name="Globex")
    version = EnvironmentVersion.objects.using(alias).select_related("environment").first()
    yield Seeded(alias=alias, day=day, acme=acme, globex=globex,
                 sessions={"acme": _sessions(alias, acme, version, day), "globex": _sessions(alias, globex, version, day)},
                 store=DirectoryStore(tmp_path / "archive"))
    ArchivedPeriod.objects.using(alias).filter(team_ref__in=[acme.pk, globex.pk]).delete()
    Team.objects.using(alias).filter(pk=globex.pk).delete()
