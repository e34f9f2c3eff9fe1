"""Setting hidden fields and sealing per split (docs/hidden-tasks.md): the REST API and the console
for uploaded task files, with their tenancy; manifest mistakes refused at publish; an append into a
split with hidden fields digests the new tasks, so they are matched back like the rest."""

from __future__ import annotations

from orsplatform.catalog.models import Split, TaskDigest
from tests.catalog.support import (
    FILE_TASKS_ENV,
    MANIFEST,
    api,
    jsonl,
    login,
    publish,
    upload_tasks,
    zip_bytes,
)
from tests.catalog.vault import publish_vault, set_split


def _quiz(owner) -> None:
    assert publish(owner, "quiz", "quiz.py", FILE_TASKS_ENV).status_code == 201
    rows = [{"question": f"q{i}", "answer": f"ANSWER{i}"} for i in range(3)]
    assert upload_tasks(owner, "quiz", "test", "t.jsonl", jsonl(rows), mode="replace").status_code == 200


def test_the_rest_api_sets_a_splits_hidden_fields_and_seal_for_its_owner_only(owner, member, outsider):
    _quiz(owner)
    path = "/api/v1/environments/acme/quiz/splits/test"
    r = api(owner).patch(path, {"hidden_fields": ["answer", " answer"], "sealed": True},
                         content_type="application/json")
    assert r.status_code == 200, r.content
    assert (r.json()["hidden_fields"], r.json()["sealed"]) == (["answer"], True)
    assert TaskDigest.objects.filter(split__name="test", split__environment__slug="quiz").count() == 3
    # A key without the publish scope, and another team (for which the environment does not exist).
    refused = api(member).patch(path, {"sealed": False}, content_type="application/json")
    assert refused.status_code == 403 and "publish" in refused.json()["detail"]
    assert api(outsider).patch(path, {"sealed": False}, content_type="application/json").status_code == 404
    bad = api(owner).patch(path, {"hidden_fields": "answer"}, content_type="application/json")
    assert bad.status_code == 400 and "hidden_fields" in bad.json()["detail"]
    assert api(owner).patch(path + "x", {"sealed": False}, content_type="application/json").status_code == 404
    # Reading the setting is catalog access, like the split list (a private environment: its team's).
    assert api(outsider).get(path).status_code == 404
    assert api(member).get(path).json() == {"name": "test", "type": "test", "num_tasks": 3, "revision": 2,
                                              "hidden_fields": ["answer"], "sealed": True}
    assert Split.objects.get(name="test", environment__slug="quiz").sealed is True


def test_the_console_sets_them_for_publishers_and_refuses_viewers(owner, viewer, outsider):
    _quiz(owner)
    url = "/console/acme/environments/quiz/splits/test/protection"
    browser = login(owner)
    r = browser.post(url, {"hidden_fields": "answer, notes", "sealed": "on"})
    assert r.status_code == 302
    page = browser.get(r["Location"]).content.decode()
    assert "hidden fields answer, notes; sealed" in page
    split = Split.objects.get(name="test", environment__slug="quiz")
    assert (split.hidden_fields, split.sealed) == (["answer", "notes"], True)
    assert login(viewer).post(url, {"hidden_fields": ""}).status_code == 403
    assert login(outsider).post(url, {"hidden_fields": ""}).status_code == 404
    assert login(owner).post(url, {"hidden_fields": ""}).status_code == 302  # unsealed, shown again
    split.refresh_from_db()
    assert (split.hidden_fields, split.sealed) == ([], False)


def test_an_append_digests_the_new_tasks_of_a_split_with_hidden_fields(owner):
    _quiz(owner)
    assert set_split_quiz(owner, hidden_fields=["answer"]).status_code == 200
    rows = [{"question": f"q{i}", "answer": f"ANSWER{i}"} for i in range(3, 5)]
    assert upload_tasks(owner, "quiz", "test", "more.jsonl", jsonl(rows)).status_code == 200
    assert sorted(TaskDigest.objects.filter(split__environment__slug="quiz").values_list("index", flat=True)) == [
        0, 1, 2, 3, 4]
    # A replace starts over.
    assert upload_tasks(owner, "quiz", "test", "t.jsonl", jsonl(rows), mode="replace").status_code == 200
    assert sorted(TaskDigest.objects.filter(split__environment__slug="quiz").values_list("index", flat=True)) == [0, 1]


def set_split_quiz(owner, **body):
    return api(owner).patch("/api/v1/environments/acme/quiz/splits/test", body, content_type="application/json")


def test_a_manifest_that_seals_a_split_the_environment_lacks_publishes_nothing(owner):
    from tests.catalog.vault import VAULT_ENV, VAULT_MANIFEST

    manifest = VAULT_MANIFEST.replace('sealed_splits = ["test"]', 'sealed_splits = ["holdout"]')
    r = publish(owner, "vault", "vault.zip", zip_bytes({"env.py": VAULT_ENV, "manifest.toml": manifest}))
    assert r.status_code == 400 and "holdout" in r.json()["detail"] and "train, test" in r.json()["detail"]
    assert not Split.objects.filter(environment__slug="vault").exists()
    wrong = MANIFEST.format(name="vault", cls="Vault") + 'hidden_task_fields = "answer"\n'
    r = publish(owner, "vault", "vault.zip", zip_bytes({"env.py": VAULT_ENV, "manifest.toml": wrong}))
    assert r.status_code == 400 and "hidden_task_fields" in r.json()["detail"]


def test_a_later_version_that_stops_declaring_a_field_leaves_it_hidden(owner):
    publish_vault(owner)
    from tests.catalog.vault import VAULT_ENV, VAULT_MANIFEST

    manifest = VAULT_MANIFEST.replace('hidden_task_fields = ["answer"]\n', "")
    r = publish(owner, "vault", "vault.zip", zip_bytes({"env.py": VAULT_ENV + "\n# v2\n", "manifest.toml": manifest}))
    assert r.status_code == 201, r.content
    assert Split.objects.get(environment__slug="vault", name="train").hidden_fields == ["answer"]
    assert set_split(owner, "train", hidden_fields=[]).json()["hidden_fields"] == []
