"""OpenAPI links of the REST API schema (a drf-spectacular postprocessing hook): what a client, and
a stateful tester such as Schemathesis, may call next with what an answer names. A publish names
its environment and version (answered 201, 200, 202 while building, 400 when the build failed), an
upload of tasks names its ingest job."""

from __future__ import annotations

ENVIRONMENT = {"team": "$request.path.team", "slug": "$request.path.slug"}

AFTER_PUBLISH = {
    "environment": ("v1_environments_retrieve", ENVIRONMENT),
    "versions": ("v1_environments_versions_list", ENVIRONMENT),
    "splits": ("v1_environments_splits_list", ENVIRONMENT),
    # A version's splits are declared by its class; "train" is the one most environments have.
    "tasks": ("v1_environments_splits_tasks_retrieve", {**ENVIRONMENT, "split": "train"}),
}
AFTER_PUBLISHED_VERSION = {"version": ("v1_environments_versions_retrieve", {**ENVIRONMENT,
                                                                            "number": "$response.body#/number"})}
AFTER_TASK_UPLOAD = {
    "job": ("v1_ingest_jobs_retrieve", {"job_id": "$response.body#/id"}),
    "tasks": ("v1_environments_splits_tasks_retrieve", {**ENVIRONMENT, "split": "$request.path.split"}),
    "environment": ("v1_environments_retrieve", ENVIRONMENT),
}
LINKS = {
    # operationId: {status: links}
    "v1_environments_versions_create": {
        "201": {**AFTER_PUBLISH, **AFTER_PUBLISHED_VERSION},
        "200": {**AFTER_PUBLISH, **AFTER_PUBLISHED_VERSION},
        "202": {**AFTER_PUBLISH, **AFTER_PUBLISHED_VERSION},
        "400": AFTER_PUBLISH,
    },
    "v1_environments_splits_tasks_create": {"200": AFTER_TASK_UPLOAD, "202": AFTER_TASK_UPLOAD},
}


def add_links(result: dict, generator, request, public) -> dict:
    for methods in result.get("paths", {}).values():
        for operation in methods.values():
            for status, links in LINKS.get(operation.get("operationId"), {}).items():
                response = operation.get("responses", {}).get(status)
                if response is None:
                    continue
                response["links"] = {name: {"operationId": target, "parameters": dict(parameters)}
                                     for name, (target, parameters) in links.items()}
    return result
