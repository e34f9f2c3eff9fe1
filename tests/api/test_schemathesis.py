"""Schemathesis against a real server's /api/schema/: every operation fuzzed (as the owner, and as no
one), then stateful runs that follow the schema's OpenAPI links from a publish to the environment's
detail, versions, splits and tasks while its first version is still building or after it failed.
The one property: no answer is a server error."""

from __future__ import annotations

import os
import uuid

import hypothesis
import pytest
import redis
import schemathesis
from django.core.files.uploadedfile import SimpleUploadedFile
from hypothesis import HealthCheck, given
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error

from orsplatform.catalog.models import Environment
from tests.api.needy import needy_package
from tests.catalog.support import api
from tests.fixtures.server import start_server

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
# A registry no build can reach: a build in the request fails at once, offline.
UNREACHABLE_INDEX = "https://127.0.0.1:9/simple"



@pytest.fixture
def broken(owner, settings):
    """acme/broken: its first (and only) build failed."""
    settings.ORS_BUILD_INDEX_URL = UNREACHABLE_INDEX
    r = api(owner).post("/api/v1/environments/acme/broken/versions?wait=1",
                        {"package": SimpleUploadedFile("broken.zip", needy_package(flavour="broken"))})
    assert r.status_code == 400 and r.json()["version"]["status"] == "failed", r.content
    return Environment.objects.get(team=owner.team, slug="broken")


@pytest.fixture
def api_server(tmp_path, settings, build_dirs):
    """A server with a broker and no worker: a queued build stays `building` for the whole test."""
    queue = f"ors-test-schemathesis-{uuid.uuid4().hex[:8]}"
    proc = start_server(tmp_path, server="uvicorn", CELERY_BROKER_URL=REDIS_URL, CELERY_TASK_ALWAYS_EAGER="false",
                        CELERY_TASK_DEFAULT_QUEUE=queue, ORS_BUILD_INDEX_URL=UNREACHABLE_INDEX,
                        ORS_UPLOAD_DIR=str(settings.ORS_UPLOAD_DIR), **build_dirs)
    yield proc
    proc.stop()
    redis.Redis.from_url(REDIS_URL).delete(queue)


def load(server, owner):
    schema = schemathesis.openapi.from_url(f"{server.url}/api/schema/")
    teams = st.sampled_from(["acme", "builtin", "globex"])
    slugs = st.sampled_from(["needy", "broken", "math"])

    @schema.hook
    def flatmap_path_parameters(context, path_parameters):
        # Mostly names that exist (the owner's team, its environments mid-build), sometimes the
        # generated ones, so links lead somewhere worth following.
        if not path_parameters:
            return st.just(path_parameters)
        fixed = {}
        if "team" in path_parameters:
            fixed["team"] = st.one_of(teams, st.just(path_parameters["team"]))
        if "slug" in path_parameters:
            fixed["slug"] = st.one_of(slugs, st.just(path_parameters["slug"]))
        if not fixed:
            return st.just(path_parameters)
        return st.fixed_dictionaries(fixed).map(lambda chosen: {**path_parameters, **chosen})

    @schema.hook
    def flatmap_body(context, body):
        if context.operation is None or context.operation.path != "/api/v1/environments/{team}/{slug}/versions":
            return st.just(body)
        if not isinstance(body, dict):
            return st.just(body)
        packages = st.sampled_from(["one", "two"]).map(needy_package)
        return st.one_of(st.just(body), packages.map(lambda package: {**body, "package": package}))

    @schema.hook
    def map_query(context, query):
        # A build within the request (?wait=1) would try the unreachable registry for every example;
        # the failed build is made once, by the `broken` fixture.
        if query and "wait" in query:
            query = {k: v for k, v in query.items() if k != "wait"}
        return query

    return schema


SETTINGS = dict(deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck), phases=[hypothesis.Phase.explicit,
                                                               hypothesis.Phase.generate])


def test_no_operation_of_the_api_answers_a_server_error(api_server, owner, broken):
    schema = load(api_server, owner)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 25
    for operation in operations:
        for headers in (owner.headers, {}):
            fuzzer(operation, headers)()


def fuzzer(operation, headers: dict):
    @hypothesis.settings(max_examples=12, **SETTINGS)
    @given(case=operation.as_strategy())
    def fuzz(case):
        response = case.call(headers=headers, timeout=60)
        case.validate_response(response, checks=[not_a_server_error])

    return fuzz


def test_following_links_from_a_publish_to_an_environment_mid_build_never_answers_a_server_error(
        api_server, owner, broken):
    # The catalog's publishing paths (the rest is fuzzed above), so the runs spend their steps there.
    schema = load(api_server, owner).include(path_regex=r"^/api/v1/(environments|ingest-jobs)")
    seen: list[tuple[str, int, object]] = []

    class Workflow(schema.as_state_machine()):
        def get_call_kwargs(self, case):
            return {"headers": owner.headers, "timeout": 60}

        def after_call(self, response, case):
            body = response.json() if response.headers.get("content-type", [""])[0].startswith(
                "application/json") else None
            seen.append((f"{case.method} {case.operation.path}", response.status_code,
                         body.get("current_version", "-") if isinstance(body, dict) else "-"))

        def validate_response(self, response, case, additional_checks=None, **kwargs):
            case.validate_response(response, checks=[not_a_server_error], transport_kwargs=kwargs)

    Workflow.run(settings=hypothesis.settings(max_examples=100, stateful_step_count=8, **SETTINGS))
    # The runs did reach what they are for: a publish left a version building, and the detail of an
    # environment with nothing current answered 200 with current_version null.
    assert ("POST /api/v1/environments/{team}/{slug}/versions", 202) in {
        (what, status) for what, status, _ in seen}, sorted(set(seen), key=str)
    assert ("GET /api/v1/environments/{team}/{slug}", 200, None) in seen
    for path in ("/versions", "/splits"):
        assert any(what == f"GET /api/v1/environments/{{team}}/{{slug}}{path}" and status == 200
                   for what, status, _ in seen), sorted(set(seen), key=str)
