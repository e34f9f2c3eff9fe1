"""Parse and validate the query parameters of the analytics pages, API and exports: the one parser
both the pages (analytics/views.py) and the REST API (api/analytics.py) call, through
``parse_report_params`` (overview and environment reports) and ``parse_explorer_params`` (the session
explorer and its exports), so a parameter means the same thing, and fails the same way, on both.

Everything that reaches a selector has been checked here: dates parse and are in order, numbers are
finite and in range, ids name things the caller's team may see. Problems raise a ValidationError
whose messages are shown on the page (or returned as a 400 by the API), never a 500.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta

from django.core.exceptions import ValidationError
from django.db.models import F, Q, TextField
from django.db.models.functions import Cast
from django.utils import timezone

from orsplatform.catalog.models import Environment, EnvironmentVersion
from orsplatform.episodes.models import Session
from orsplatform.teams.models import ApiKey, Team

RANGES: dict[str, timedelta | None] = {
    "24h": timedelta(hours=24),
    "7d": timedelta(days=7),
    "30d": timedelta(days=30),
    "90d": timedelta(days=90),
    "365d": timedelta(days=365),
    "all": None,
}
RANGE_LABELS = {"24h": "24 hours", "7d": "7 days", "30d": "30 days", "90d": "90 days", "365d": "1 year",
                "all": "All time"}
DEFAULT_RANGE = "30d"
MAX_PAGE = 10_000
MAX_PARAM_LENGTH = 200
# Dates outside these years are typos or probes; refusing them also keeps date arithmetic away
# from datetime's year-1 and year-9999 overflow.
MIN_YEAR, MAX_YEAR = 1970, 2999
WINDOW_PARAMS = ("range", "start", "end")
SESSION_PARAMS = ("environment", "version", "api_key", "protocol", "status", "outcome", "split", "task", "q",
                  "reward_min", "reward_max")
ENDED_STATUSES = ("deleted", "expired", "lost")
# How an episode ended (or where it is), from its status and finished flag: an ended episode whose
# environment said finished is "finished" however the session was closed; a session deleted before
# that was "abandoned". Shown instead of the raw status, which says "deleted" for both.
OUTCOMES: dict[str, Q] = {
    "finished": Q(status__in=ENDED_STATUSES, finished=True),
    "abandoned": Q(status="deleted", finished=False),
    "expired": Q(status="expired", finished=False),
    "lost": Q(status="lost", finished=False),
    "failed": Q(status="failed"),
    "running": Q(status="ready"),
    "starting": Q(status="creating"),
}
# The explorer's columns and what each sorts on (ties broken by newest first).
SORTS: dict[str, tuple] = {
    "started": ("created_at",),
    "session": ("sid",),
    "environment": ("environment__team__slug", "environment__slug", "version__number"),
    "task": ("split", "task_index"),
    "api_key": ("api_key__name",),
    "outcome": ("status", "finished"),
    "duration": ("duration",),
    "calls": ("calls",),
    "reward": ("total_reward",),
}
DEFAULT_SORT = "-started"


def outcome_of(status: str, finished: bool) -> str:
    if status in ENDED_STATUSES:
        if finished:
            return "finished"
        return "abandoned" if status == "deleted" else status
    return {"ready": "running", "creating": "starting"}.get(status, status)


@dataclass(frozen=True)
class Window:
    """A half-open time range [start, end) in UTC; start None means from the first session on."""

    start: datetime | None
    end: datetime
    preset: str | None  # the quick range chosen, None for custom dates

    def query(self) -> dict[str, str]:
        if self.preset is not None:
            return {"range": self.preset}
        out = {"end": self.end.isoformat(timespec="seconds").replace("+00:00", "Z")}
        if self.start is not None:
            out["start"] = self.start.isoformat(timespec="seconds").replace("+00:00", "Z")
        return out

    def as_dict(self) -> dict[str, str | None]:
        return {"start": self.start.isoformat() if self.start else None, "end": self.end.isoformat(),
                "range": self.preset}

    @property
    def label(self) -> str:
        if self.preset == "all":
            return "all time"
        if self.preset is not None:
            return f"the last {RANGE_LABELS[self.preset]} up to now"
        start = self.start.strftime("%Y-%m-%d %H:%M") if self.start else "the beginning"
        return f"{start} to {self.end.strftime('%Y-%m-%d %H:%M')}"


@dataclass(frozen=True)
class SessionFilters:
    window: Window
    environment: Environment | None = None
    version: EnvironmentVersion | None = None
    api_key: ApiKey | None = None
    protocol: str | None = None  # the face that opened the episode (Session.Protocol)
    status: str | None = None
    outcome: str | None = None
    split: str | None = None
    task_index: int | None = None
    text: str | None = None  # searched in the task spec
    reward_min: float | None = None
    reward_max: float | None = None
    raw: dict[str, str] = field(default_factory=dict)  # the accepted parameters, for links

    def query(self) -> dict[str, str]:
        return {**self.window.query(), **self.raw}

    def apply(self, qs, *, sealed_reader: int | None):
        """Narrow a Session queryset (already scoped to the team) to these filters. `sealed_reader`:
        the team whose sealed specs the viewer reads (catalog/hidden.py); the text search looks in
        no other sealed spec, or it would tell what the spec holds."""
        if self.window.start is not None:
            qs = qs.filter(created_at__gte=self.window.start)
        qs = qs.filter(created_at__lt=self.window.end)
        if self.environment is not None:
            qs = qs.filter(environment=self.environment)
        if self.version is not None:
            qs = qs.filter(version=self.version)
        if self.api_key is not None:
            qs = qs.filter(api_key=self.api_key)
        if self.protocol:
            qs = qs.filter(protocol=self.protocol)
        if self.status:
            qs = qs.filter(status=self.status)
        if self.outcome:
            qs = qs.filter(OUTCOMES[self.outcome])
        if self.split is not None:
            qs = qs.filter(split=self.split)
        if self.task_index is not None:
            qs = qs.filter(task_index=self.task_index)
        if self.text:
            readable = Q(sealed=False) | Q(environment__team_id=sealed_reader) if sealed_reader else Q(sealed=False)
            qs = qs.filter(readable).annotate(task_text=Cast("task_spec", TextField())).filter(
                task_text__icontains=self.text)
        if self.reward_min is not None:
            qs = qs.filter(total_reward__gte=self.reward_min)
        if self.reward_max is not None:
            qs = qs.filter(total_reward__lte=self.reward_max)
        return qs


def _get(params: Mapping[str, str], name: str, errors: list[str]) -> str:
    value = params.get(name) or ""
    if not isinstance(value, str):
        value = str(value)
    value = value.strip()
    if len(value) > MAX_PARAM_LENGTH:
        errors.append(f"The {name} parameter is too long (at most {MAX_PARAM_LENGTH} characters).")
        return ""
    if "\x00" in value:
        errors.append(f"The {name} parameter contains a NUL character.")
        return ""
    return value


def _parse_moment(raw: str, name: str, *, end: bool, errors: list[str]) -> datetime | None:
    """A date (YYYY-MM-DD) or an ISO 8601 date-time; naive values are UTC. A bare end date
    includes that whole day."""
    try:
        if len(raw) == 10:
            day = date.fromisoformat(raw)
            if not MIN_YEAR <= day.year <= MAX_YEAR:
                raise ValueError
            moment = datetime.combine(day, time.min, tzinfo=UTC)
            return moment + timedelta(days=1) if end else moment
        moment = datetime.fromisoformat(raw.replace(" ", "T", 1) if "T" not in raw else raw)
        if not MIN_YEAR <= moment.year <= MAX_YEAR:
            raise ValueError
    except (ValueError, OverflowError):
        errors.append(
            f"The {name} date {raw!r} is not a valid date: use YYYY-MM-DD or YYYY-MM-DDTHH:MM "
            f"(UTC), with a year between {MIN_YEAR} and {MAX_YEAR}."
        )
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


def parse_window(params: Mapping[str, str], *, now: datetime | None = None) -> Window:
    errors: list[str] = []
    now = now or timezone.now()
    preset = _get(params, "range", errors)
    raw_start = _get(params, "start", errors)
    raw_end = _get(params, "end", errors)
    if preset and preset not in RANGES:
        errors.append(f"Unknown time range {preset!r}: choose one of {', '.join(RANGES)}.")
    start = _parse_moment(raw_start, "start", end=False, errors=errors) if raw_start else None
    end = _parse_moment(raw_end, "end", end=True, errors=errors) if raw_end else None
    if errors:
        raise ValidationError(errors)
    if raw_start or raw_end:
        # Explicit dates win over a quick range; an open end means "until now".
        end = end or now
        if start is not None and start >= end:
            raise ValidationError(
                f"The start ({start:%Y-%m-%d %H:%M}) must be before the end ({end:%Y-%m-%d %H:%M}) of the time range.")
        return Window(start=start, end=end, preset=None)
    preset = preset or DEFAULT_RANGE
    span = RANGES[preset]
    return Window(start=now - span if span is not None else None, end=now, preset=preset)


def _parse_float(raw: str, name: str, errors: list[str]) -> float | None:
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        errors.append(f"The {name} {raw!r} is not a number.")
        return None
    if not math.isfinite(value):
        errors.append(f"The {name} must be a finite number.")
        return None
    return value


def environment_visible_to(*, team: Team, full_name: str) -> Environment | None:
    """An environment the team may report on: its own, a public one, or one its sessions ran on.
    Another team's private environment is indistinguishable from a missing one."""
    team_slug, sep, slug = full_name.partition("/")
    if not sep or not team_slug or not slug or "/" in slug:
        return None
    env = Environment.objects.select_related("team").filter(team__slug=team_slug, slug=slug).first()
    if env is None:
        return None
    if env.team_id == team.id or env.visibility == Environment.Visibility.PUBLIC:
        return env
    if Session.objects.filter(team=team, environment=env).exists():
        return env
    return None


def parse_version(raw: str, *, environment: Environment | None, errors: list[str]) -> EnvironmentVersion | None:
    if not raw:
        return None
    if not re.fullmatch(r"[0-9]{1,9}", raw) or int(raw) < 1:
        errors.append(f"The version {raw!r} is not a version number (1, 2, …).")
        return None
    if environment is None:
        errors.append("Choose an environment to filter by version.")
        return None
    version = EnvironmentVersion.objects.filter(environment=environment, number=int(raw)).first()
    if version is None:
        errors.append(f"The environment {environment.full_name} has no version {int(raw)}.")
    return version


def parse_session_filters(params: Mapping[str, str], *, team: Team, now: datetime | None = None) -> SessionFilters:
    errors: list[str] = []
    try:
        window = parse_window(params, now=now)
    except ValidationError as exc:
        errors.extend(exc.messages)
        window = None
    raw = {name: _get(params, name, errors) for name in SESSION_PARAMS}
    environment = None
    if raw["environment"]:
        environment = environment_visible_to(team=team, full_name=raw["environment"])
        if environment is None:
            errors.append(f"Unknown environment {raw['environment']!r}: use team/slug of an environment your team can see.")
    version = parse_version(raw["version"], environment=environment, errors=errors) if (
        environment is not None or not raw["environment"]) else None
    api_key = None
    if raw["api_key"]:
        api_key = ApiKey.objects.filter(team=team, prefix=raw["api_key"]).first()
        if api_key is None:
            errors.append(f"Unknown API key {raw['api_key']!r}: give the prefix of one of your team's keys.")
    protocol = raw["protocol"] or None
    if protocol and protocol not in Session.Protocol.values:
        errors.append(f"Unknown protocol {protocol!r}: choose one of {', '.join(Session.Protocol.values)}.")
    status = raw["status"] or None
    if status and status not in Session.Status.values:
        errors.append(f"Unknown status {status!r}: choose one of {', '.join(Session.Status.values)}.")
    outcome = raw["outcome"] or None
    if outcome and outcome not in OUTCOMES:
        errors.append(f"Unknown outcome {outcome!r}: choose one of {', '.join(OUTCOMES)}.")
    task_index = None
    if raw["task"]:
        if re.fullmatch(r"[0-9]{1,9}", raw["task"]):
            task_index = int(raw["task"])
        else:
            errors.append(f"The task {raw['task']!r} is not a task index (0, 1, …).")
    reward_min = _parse_float(raw["reward_min"], "minimum reward", errors)
    reward_max = _parse_float(raw["reward_max"], "maximum reward", errors)
    if reward_min is not None and reward_max is not None and reward_min > reward_max:
        errors.append(f"The minimum reward ({reward_min:g}) is above the maximum reward ({reward_max:g}).")
    if errors:
        raise ValidationError(errors)
    return SessionFilters(
        window=window, environment=environment, version=version, api_key=api_key, protocol=protocol, status=status,
        outcome=outcome, split=raw["split"] or None, task_index=task_index,
        text=raw["q"] or None, reward_min=reward_min, reward_max=reward_max, raw={k: v for k, v in raw.items() if v},
    )


def parse_page(params: Mapping[str, str]) -> int:
    raw = (params.get("page") or "1").strip()
    if not re.fullmatch(r"[0-9]{1,9}", raw):
        raise ValidationError(f"The page {raw[:40]!r} is not a page number (1, 2, …).")
    page = int(raw)
    if not 1 <= page <= MAX_PAGE:
        raise ValidationError(f"The page must be between 1 and {MAX_PAGE:,}; narrow the filters to see older sessions.")
    return page


def parse_sort(params: Mapping[str, str]) -> str:
    raw = (params.get("sort") or "").strip()[:40] or DEFAULT_SORT
    if raw.lstrip("-") not in SORTS:
        raise ValidationError(f"Unknown sort {raw!r}: choose one of {', '.join(SORTS)} (prefix - for descending).")
    return raw


NULLABLE_SORT_FIELDS = {"task_index", "api_key__name", "total_reward"}


def sort_order(sort: str) -> list:
    """ORDER BY terms for a sort key; newest first breaks ties. Only columns that can be empty say
    where empties go: an explicit NULLS LAST on created_at would stop PostgreSQL from reading the
    (team, created_at) index backwards for the default newest-first page."""
    descending = sort.startswith("-")
    terms = []
    for f in SORTS[sort.lstrip("-")]:
        if f in NULLABLE_SORT_FIELDS:
            terms.append(F(f).desc(nulls_last=True) if descending else F(f).asc(nulls_last=True))
        else:
            terms.append(F(f).desc() if descending else F(f).asc())
    return [*terms, F("created_at").desc(), F("id").desc()]


@dataclass(frozen=True)
class ExplorerParams:
    filters: SessionFilters
    page: int
    sort: str


def parse_explorer_params(params: Mapping[str, str], *, team: Team, now: datetime | None = None) -> ExplorerParams:
    """The session explorer's (and its exports') parameters, for the page and the REST API alike."""
    errors: list[str] = []

    def attempt(parse):
        try:
            return parse()
        except ValidationError as exc:
            errors.extend(exc.messages)
            return None

    filters = attempt(lambda: parse_session_filters(params, team=team, now=now))
    page = attempt(lambda: parse_page(params))
    sort = attempt(lambda: parse_sort(params))
    if errors:
        raise ValidationError(errors)
    return ExplorerParams(filters=filters, page=page, sort=sort)


@dataclass(frozen=True)
class ReportParams:
    window: Window
    version: EnvironmentVersion | None = None


def parse_report_params(params: Mapping[str, str], *, environment: Environment | None = None,
                        now: datetime | None = None) -> ReportParams:
    """A report's time range and, for one environment, its version: the overview and environment
    pages and their REST API counterparts."""
    errors: list[str] = []
    window = None
    try:
        window = parse_window(params, now=now)
    except ValidationError as exc:
        errors.extend(exc.messages)
    version = None
    if environment is not None:
        version = parse_version((params.get("version") or "").strip()[:20], environment=environment, errors=errors)
    if errors:
        raise ValidationError(errors)
    return ReportParams(window=window, version=version)


def environment_q(environment: Environment | None, version: EnvironmentVersion | None) -> Q:
    """Filter for rollup rows of one environment (and version)."""
    q = Q()
    if environment is not None:
        q &= Q(environment=environment)
    if version is not None:
        q &= Q(version=version)
    return q
