from __future__ import annotations

from django.http import Http404

from orsplatform.teams.models import ApiKey, Membership, Team

# Web roles: owners and admins manage the team (keys, agents); members also act (launch, cancel and
# resume evaluation runs, ping agents); viewers only look.
MANAGER_ROLES = (Membership.Role.OWNER, Membership.Role.ADMIN)
ACTING_ROLES = (*MANAGER_ROLES, Membership.Role.MEMBER)


def teams_for_user(*, user) -> list[tuple[Team, str]]:
    """(team, role) pairs the user may see; platform superusers see every team."""
    if user.is_superuser:
        roles = {m.team_id: m.role for m in Membership.objects.filter(user=user)}
        return [(t, roles.get(t.id, "superuser")) for t in Team.objects.order_by("slug")]
    return [(m.team, m.role) for m in Membership.objects.select_related("team").filter(user=user).order_by("team__slug")]


def team_for_user(*, user, slug: str) -> tuple[Team, str]:
    """The team and the user's role in it; 404 when the user may not see it."""
    team = Team.objects.filter(slug=slug).first()
    if team is None:
        raise Http404("No such team.")
    if user.is_superuser:
        membership = Membership.objects.filter(user=user, team=team).first()
        return team, membership.role if membership else "superuser"
    membership = Membership.objects.filter(user=user, team=team).first()
    if membership is None:
        raise Http404("No such team.")
    return team, membership.role


def api_key_manages(*, api_key_id: int, team_id: int) -> bool:
    """May this key of the team do what only owners and admins do on the web (delete an
    environment)? Its manage scope, and a creator who is still an owner or admin of the team (a
    key outlives its creator's demotion); a key no person created (manage.py create_api_key, an
    operator's) has only its scope to go by."""
    key = ApiKey.objects.select_related("created_by").filter(id=api_key_id, team_id=team_id).first()
    if key is None or "manage" not in (key.scopes or []):
        return False
    user = key.created_by
    return user is None or user.is_superuser or Membership.objects.filter(
        user=user, team_id=team_id, role__in=MANAGER_ROLES).exists()


def team_ids_for_user(*, user) -> list[int]:
    return list(Membership.objects.filter(user=user).values_list("team_id", flat=True))


def can_manage(*, user, role: str) -> bool:
    return user.is_superuser or role in MANAGER_ROLES


def can_act(*, user, role: str) -> bool:
    """May the user change things (not only look at them): every role but viewer."""
    return user.is_superuser or role in ACTING_ROLES


def api_keys_for_team(*, team: Team) -> list[ApiKey]:
    return list(ApiKey.objects.filter(team=team).select_related("environment__team", "created_by").order_by("-created_at"))


def api_key_of_team(*, team_id: int, key_id: int | None) -> ApiKey | None:
    """The key a request came with (``Caller.api_key_id``), with the user who made it."""
    if key_id is None:
        return None
    return ApiKey.objects.select_related("created_by").filter(team_id=team_id, id=key_id).first()


def members_for_team(*, team: Team) -> list[Membership]:
    return list(Membership.objects.filter(team=team).select_related("user").order_by("role", "user__username"))
