"""Environment pages: the public catalog, an environment's card (README, tools, splits, how to use
it), its task browser, version history and file diffs. Thin: parse the request, call selectors.
Public environments are shown to everyone, private ones to their team; anyone else gets a 404."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.urls import NoReverseMatch, reverse
from django.views.decorators.http import require_GET, require_POST

from orsplatform.catalog.hidden import redact
from orsplatform.catalog.models import Environment
from orsplatform.catalog.selectors import rollback_undo, task_text
from orsplatform.hub import files as package_files
from orsplatform.hub import selectors
from orsplatform.hub.diff import version_diff
from orsplatform.hub.render_limits import RenderBusy, render_slot
from orsplatform.hub.services import task_prompt_cached, task_prompt_render
from orsplatform.teams.selectors import team_ids_for_user

MAX_QUERY = 100


def _param(request: HttpRequest, name: str) -> str:
    return (request.GET.get(name) or "").strip()[:MAX_QUERY]


def _environment(request: HttpRequest, team: str, env: str) -> tuple[selectors.Viewer, Environment]:
    viewer = selectors.viewer_of(request.user)
    environment = selectors.environment_for_viewer(viewer=viewer, team_slug=team, slug=env)
    if environment is None:
        raise Http404("No such environment.")
    return viewer, environment


def _base(request: HttpRequest, viewer: selectors.Viewer, environment: Environment, tab: str) -> dict[str, Any]:
    sessions_team = selectors.sessions_team(user=request.user, viewer=viewer, environment=environment)
    return {
        "environment": environment, "version": environment.current_version, "tab": tab,
        "sessions_team": sessions_team,
        "analytics_url": reverse("analytics:environment", args=[sessions_team.slug, environment.team.slug,
                                                              environment.slug]) if sessions_team else None,
    }


def task_url(environment: Environment, split: str, index: int) -> str | None:
    """A task's page; None for a split name no URL can carry (sessions may name any split)."""
    try:
        return reverse("hub:task", args=[environment.team.slug, environment.slug, split, index])
    except NoReverseMatch:
        return None


def sessions_url(team, environment: Environment, split: str, index: int) -> str:
    """The session explorer narrowed to one task (all time), for the viewer's team."""
    return reverse("analytics:sessions", args=[team.slug]) + "?" + urlencode(
        {"range": "all", "environment": environment.full_name, "split": split, "task": index})


@require_GET
def catalog(request: HttpRequest) -> HttpResponse:
    query, team, visibility, sort = (_param(request, n) for n in ("q", "team", "visibility", "sort"))
    page = selectors.catalog_page(user=request.user, query=query, team=team, visibility=visibility,
                                  sort=sort or "name", page=_param(request, "page") or 1)
    keep = {k: v for k, v in {"q": query, "team": team, "visibility": visibility, "sort": sort}.items() if v}
    usage = selectors.catalog_usage(environment_ids=[e.id for e in page.object_list])
    for env in page.object_list:
        env.usage = usage.get(env.id)
    return render(request, "hub/catalog.html", {
        "page": page, "environments": page.object_list, "q": query, "team": team, "visibility": visibility,
        "sort": sort or "name", "teams": selectors.catalog_teams(user=request.user),
        "visibilities": Environment.Visibility.values, "sorts": list(selectors.SORTS),
        "page_qs": urlencode(keep),
    })


def _snippets(request: HttpRequest, environment: Environment, split: str | None) -> list[dict[str, str]]:
    base = request.build_absolute_uri("/").rstrip("/")
    name = environment.full_name
    split = split or "test"
    return [
        {"client": "ors.client", "id": "ors", "code": (
            "from ors.client import ORS\n\n"
            f'client = ORS(base_url="{base}", api_key="ors_...")  # or ORS_API_KEY\n'
            f'env = client.environment("{name}")\n'
            f'task = env.list_tasks("{split}")[0]\n'
            "with env.session(task=task) as session:\n"
            "    print(session.get_prompt()[0].text)\n")},
        {"client": "openreward", "id": "openreward", "code": (
            "import os\nfrom openreward import OpenReward\n\n"
            f'os.environ["OPENREWARD_SESSION_URL"] = "{base}"\n'
            f'env = OpenReward(api_key="ors_...").environments.get("{name}")\n'
            f'task = env.list_tasks("{split}")[0]\n'
            "with env.session(task=task) as session:\n"
            "    print(session.get_prompt())\n")},
        {"client": "OpenEnv (TRL)", "id": "openenv", "code": (
            "from openenv.core.generic_client import GenericEnvClient\n\n"
            f'env = GenericEnvClient(base_url="{base}/openenv/{name}",\n'
            '                       headers={"X-API-Key": "ors_..."}).sync()\n'
            "with env:\n"
            f'    obs = env.reset(split="{split}", index=0).observation\n'
            '    print(obs["metadata"]["prompt"])\n')},
        {"client": "curl", "id": "curl", "code": (
            f"B={base}\n"
            f"curl $B/{name}/tools\n"
            f"curl -X POST $B/{name}/task -d '{{\"split\":\"{split}\",\"index\":0}}'\n")},
    ]


@require_GET
def environment(request: HttpRequest, team: str, env: str) -> HttpResponse:
    viewer, environment = _environment(request, team, env)
    version = environment.current_version
    if version is None:
        # Only its own team gets here (hub.selectors._visible): a first build that failed or still
        # runs. No snippets or tools that would not work: its state, its log and what to do.
        return render(request, "hub/unpublished.html", {
            **_base(request, viewer, environment, "overview"),
            "last_version": environment.versions.order_by("-number").first(),
            "can_delete": selectors.can_delete(user=request.user, environment=environment),
        })
    splits = selectors.splits_of(environment=environment)
    tools = [{"name": t.get("name", ""), "description": t.get("description", ""),
              "schema": json.dumps(t.get("input_schema") or t.get("inputSchema") or {}, indent=2, sort_keys=True)}
             for t in (version.tools if version else [])]
    return render(request, "hub/environment.html", {
        **_base(request, viewer, environment, "overview"),
        "readme": selectors.readme_html(version=version), "tools": tools, "splits": splits,
        "snippets": _snippets(request, environment, splits[0].name if splits else None),
        "recent_versions": list(selectors.versions_page(environment=environment, page=1, per_page=5)),
        "facts": selectors.card_facts(version=version),
    })


def _sealed_to(request: HttpRequest, environment: Environment, split) -> str | None:
    """Why the viewer may not read this split's task specs (a sealed split: publishers of the
    owning team only), or None when it may."""
    if split is None or not split.sealed or selectors.can_publish_to(user=request.user, environment=environment):
        return None
    return (f"Split '{split.name}' is sealed: its tasks are readable only by the publishers of "
            f"{environment.team.slug}. Episodes may still run on it by split and index.")


def _shown(viewer: selectors.Viewer, environment: Environment, split, spec: Any) -> Any:
    """A task spec as the viewer may see it: hidden fields only for the owning team."""
    if viewer.everything or environment.team_id in viewer.team_ids:
        return spec
    return redact(spec, frozenset(split.hidden_fields or ()))


@require_GET
def tasks(request: HttpRequest, team: str, env: str) -> HttpResponse:
    viewer, environment = _environment(request, team, env)
    splits = selectors.splits_of(environment=environment)
    wanted = _param(request, "split")
    split = next((s for s in splits if s.name == wanted), splits[0] if splits and not wanted else None)
    if split is None and wanted:
        raise Http404("No such split.")
    context = _base(request, viewer, environment, "tasks")
    rows: list[dict[str, Any]] = []
    page = None
    sealed = _sealed_to(request, environment, split)
    if sealed is not None:
        return render(request, "hub/tasks.html", {**context, "splits": splits, "split": split, "rows": [],
                                                  "sealed": sealed}, status=403)
    if split is not None:
        page = selectors.tasks_page(split=split, page=_param(request, "page") or 1)
        for t in page.object_list:
            t["spec"] = _shown(viewer, environment, split, t["spec"])
        stats = selectors.task_stats(viewer=viewer, environment=environment, split=split.name,
                                     indices=[t["index"] for t in page.object_list])
        for t in page.object_list:
            rows.append({**t, "text": task_text(t["spec"]), "stats": stats.get(t["index"]),
                         "url": task_url(environment, split.name, t["index"]),
                         "sessions_url": sessions_url(context["sessions_team"], environment, split.name, t["index"])
                         if context["sessions_team"] else None})
    return render(request, "hub/tasks.html", {
        **context, "splits": splits, "split": split, "page": page, "rows": rows,
        "page_qs": urlencode({"split": split.name}) if split else "",
    })


@require_GET
def task(request: HttpRequest, team: str, env: str, split: str, index: int) -> HttpResponse:
    viewer, environment = _environment(request, team, env)
    split_obj = selectors.split_of(environment=environment, name=split)
    row = selectors.task_of(split=split_obj, index=index) if split_obj else None
    if row is None:
        raise Http404("No such task.")
    context = _base(request, viewer, environment, "tasks")
    sealed = _sealed_to(request, environment, split_obj)
    if sealed is not None:
        return render(request, "hub/tasks.html", {**context, "splits": selectors.splits_of(environment=environment),
                                                  "split": split_obj, "rows": [], "sealed": sealed}, status=403)
    spec = _shown(viewer, environment, split_obj, row.spec)
    stats = selectors.task_stats(viewer=viewer, environment=environment, split=split, indices=[index]).get(index)
    return render(request, "hub/task.html", {
        **context, "split": split_obj, "task": row, "text": task_text(spec, limit=2000),
        "spec": json.dumps(spec, indent=2, sort_keys=True, ensure_ascii=False), "stats": stats,
        "prompt": selectors.task_recorded_prompt(viewer=viewer, environment=environment, split=split, index=index),
        "rendered": task_prompt_cached(version=environment.current_version, spec=row.spec)
        if environment.current_version else None,
        "sessions_url": sessions_url(context["sessions_team"], environment, split, index)
        if context["sessions_team"] else None,
        "previous": index - 1 if index > 0 else None, "next": index + 1 if index + 1 < split_obj.num_tasks else None,
    })


@login_required
@require_POST
def task_prompt(request: HttpRequest, team: str, env: str, split: str, index: int) -> HttpResponse:
    """Render the task's prompt with the current version's code (a click, never a page view: it runs
    tenant code in a child process). Signed-in viewers only, and cached per version and task. At
    most ORS_PROMPT_RENDERS_PER_USER (and _PER_TEAM) run at once: past them 429 with {"detail"},
    or, for a browser, the task page again with the reason as a message."""
    _, environment = _environment(request, team, env)
    split_obj = selectors.split_of(environment=environment, name=split)
    row = selectors.task_of(split=split_obj, index=index) if split_obj else None
    if row is None or environment.current_version is None:
        raise Http404("No such task.")
    sealed = _sealed_to(request, environment, split_obj)
    if sealed is not None:
        return JsonResponse({"detail": sealed}, status=403)
    page = reverse("hub:task", args=[team, env, split, index])
    if task_prompt_cached(version=environment.current_version, spec=row.spec) is None:
        try:
            with render_slot(user_id=request.user.id, team_ids=team_ids_for_user(user=request.user)):
                task_prompt_render(version=environment.current_version, spec=row.spec)
        except RenderBusy as exc:
            if "text/html" in request.headers.get("Accept", ""):
                messages.warning(request, exc.detail)
                return redirect(page)
            return JsonResponse({"detail": exc.detail}, status=429, headers={"Retry-After": "5"})
    return redirect(page + "#rendered-prompt")


@require_GET
def versions(request: HttpRequest, team: str, env: str) -> HttpResponse:
    viewer, environment = _environment(request, team, env)
    page = selectors.versions_page(environment=environment, page=_param(request, "page") or 1)
    can_publish = selectors.can_publish_to(user=request.user, environment=environment)
    return render(request, "hub/versions.html", {
        **_base(request, viewer, environment, "versions"), "page": page, "versions": page.object_list,
        "can_publish": can_publish, "numbers": selectors.version_numbers(environment=environment),
        # After a rollback from this page: "Undo: serve @M again" (publishers of the team only).
        "undo": rollback_undo(team_id=environment.team_id, ref=_param(request, "undo")) if can_publish else None,
    })


def _version(environment: Environment, number: int | None):
    """The version a files page shows: ``number``, else the current one (404 for no such version)."""
    if number is None:
        return environment.current_version
    version = selectors.version_of(environment=environment, number=number) if number < 2**31 else None
    if version is None:
        raise Http404("No such version.")
    return version


@require_GET
def files(request: HttpRequest, team: str, env: str, number: int | None = None) -> HttpResponse:
    """A version's files with their sizes (the current one without a number): the package, and the
    data at /orwd_data; each package file opens as text."""
    viewer, environment = _environment(request, team, env)
    version = _version(environment, number)
    return render(request, "hub/files.html", {
        **_base(request, viewer, environment, "files"), "shown": version,
        "numbers": selectors.version_numbers(environment=environment),
        "listings": selectors.version_files(version=version),
    })


@require_GET
def version_file(request: HttpRequest, team: str, env: str, number: int, path: str) -> HttpResponse:
    """One package file's text (size-capped); a binary file is named, not shown."""
    viewer, environment = _environment(request, team, env)
    version = _version(environment, number)
    found = selectors.version_file(version=version, path=path)
    if found is None:
        raise Http404("No such file.")
    return render(request, "hub/file.html", {
        **_base(request, viewer, environment, "files"), "shown": version, "file": found,
        "max_bytes": package_files.MAX_VIEW_BYTES,
    })


def _number(raw: str) -> int | None:
    return int(raw) if raw.isdigit() and len(raw) <= 9 else None


@require_GET
def diff(request: HttpRequest, team: str, env: str) -> HttpResponse:
    viewer, environment = _environment(request, team, env)
    numbers = selectors.version_numbers(environment=environment)
    a_raw, b_raw = _param(request, "a"), _param(request, "b")
    a_num = _number(a_raw) if a_raw else (numbers[1] if len(numbers) > 1 else None)
    b_num = _number(b_raw) if b_raw else (numbers[0] if numbers else None)
    a = selectors.version_of(environment=environment, number=a_num) if a_num else None
    b = selectors.version_of(environment=environment, number=b_num) if b_num else None
    if (a_raw and a is None) or (b_raw and b is None):
        raise Http404("No such version.")
    changes = version_diff(a, b) if a is not None and b is not None else []
    return render(request, "hub/diff.html", {
        **_base(request, viewer, environment, "versions"), "numbers": numbers, "a": a, "b": b,
        "changes": changes, "changed": [c for c in changes if c.change != "same"],
        "unchanged": [c for c in changes if c.change == "same"],
    })
