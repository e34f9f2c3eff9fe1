"""An archived period read back through a running server: the team's export and the session
explorer answer the same calls before and after the day left the database, marked archived after."""

from __future__ import annotations

from datetime import UTC, datetime

import httpx
import orjson

from orsplatform.auditlog import archive
from orsplatform.auditlog.models import RetentionPolicy
from tests.fixtures.server import start_server, wait_ready

WINDOW = {"start": "2000-01-01", "end": "2999-12-31"}
PASSWORD = "archived-reads-pw-1"


def _calls(record: dict) -> list[dict]:
    return [{k: v for k, v in c.items() if k != "archived"} for c in record["calls"]]


def _read(base: str, owner, sid: str) -> tuple[dict, dict]:
    with httpx.Client(base_url=base, headers=owner.headers, timeout=60) as http:
        export = http.get("/api/v1/analytics/export.jsonl", params=WINDOW)
        assert export.status_code == 200, export.text
        records = {r["sid"]: r for r in map(orjson.loads, export.content.splitlines())}
        detail = http.get(f"/api/v1/analytics/sessions/{sid}")
        assert detail.status_code == 200, detail.text
    return records, detail.json()


def test_an_archived_day_reads_back_through_the_export_and_the_explorer_with_the_same_calls(
        seeded, server_database, owner, tmp_path):
    sid = seeded.sessions["acme"][0].sid
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.using(seeded.alias).get(username=owner.username)
    user.set_password(PASSWORD)
    user.save(using=seeded.alias)
    server = wait_ready(start_server(tmp_path, DATABASE_URL=server_database.url(),
                                     ORS_AUDIT_ARCHIVE_URL=str(seeded.store.root)), 180)
    try:
        before, detail_before = _read(server.url, owner, sid)
        assert {s.sid for s in seeded.sessions["acme"]} <= set(before)
        assert not any(r["archived"] for r in before.values())

        RetentionPolicy.objects.using(seeded.alias).create(team=seeded.acme, hot_days=5,
                                                          updated_at=datetime.now(UTC))
        report = archive.archive_run(store=seeded.store, using=seeded.alias)
        assert report.deleted == [(seeded.day, seeded.acme.pk, 6)] and seeded.calls("acme") == []

        after, detail_after = _read(server.url, owner, sid)
        page = _page(server.url, owner, sid)
    finally:
        server.stop()
    for s in seeded.sessions["acme"]:
        assert _calls(after[s.sid]) == _calls(before[s.sid]) and len(after[s.sid]["calls"]) == 3
        assert after[s.sid]["archived"] is True
    strip = [{k: v for k, v in c.items() if k != "archived"} for c in detail_after["tool_calls"]]
    assert strip == [{k: v for k, v in c.items() if k != "archived"} for c in detail_before["tool_calls"]]
    assert len(strip) == 3 and all(c["archived"] for c in detail_after["tool_calls"])
    assert detail_after["archived"] is True and detail_after["total_calls"] == 3
    assert 'id="archived-note"' in page and page.count('class="muted call-archived"') == 3


def _page(base: str, owner, sid: str) -> str:
    """The explorer's HTML page of the session, signed in as the owner."""
    import re

    with httpx.Client(base_url=base, timeout=60, follow_redirects=False) as http:
        login = http.get("/accounts/login/")
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', login.text).group(1)
        signed = http.post("/accounts/login/", data={"username": owner.username, "password": PASSWORD,
                                                     "csrfmiddlewaretoken": token},
                           headers={"Referer": f"{base}/accounts/login/"})
        assert signed.status_code == 302, signed.text[:500]
        page = http.get(f"/analytics/{owner.team.slug}/sessions/{sid}/")
        assert page.status_code == 200, page.text[:500]
        return page.text
