from __future__ import annotations

import hashlib
import secrets as pysecrets
from dataclasses import dataclass
from datetime import datetime

from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from orsplatform.teams.models import RESERVED_SEGMENTS, ApiKey, Membership, Team, slug_validator

ALL_SCOPES = [s.value for s in ApiKey.Scope]


def hash_secret(secret: str) -> str:
    # The secret is 32 random bytes, so a plain SHA-256 is enough (no need for a slow KDF).
    return hashlib.sha256(secret.encode()).hexdigest()


def validate_slug(slug: str) -> None:
    slug_validator(slug)
    if slug in RESERVED_SEGMENTS:
        raise ValidationError(f"'{slug}' is reserved by the platform.")


def team_create(*, slug: str, name: str = "") -> Team:
    validate_slug(slug)
    if Team.objects.filter(slug=slug).exists():
        raise ValidationError(f"Team '{slug}' already exists.")
    return Team.objects.create(slug=slug, name=name or slug)


def team_get_or_create_builtin(*, slug: str) -> Team:
    team, _ = Team.objects.get_or_create(slug=slug, defaults={"name": "Built-in environments"})
    return team


def membership_add(*, team: Team, username: str, role: str = Membership.Role.MEMBER) -> Membership:
    if role not in Membership.Role.values:
        raise ValidationError(f"Unknown role '{role}'.")
    user, _ = get_user_model().objects.get_or_create(username=username)
    membership, _ = Membership.objects.update_or_create(user=user, team=team, defaults={"role": role})
    return membership


def user_set_password(*, username: str, password: str) -> None:
    """Give a web user a password (operators' `add_member --password`, `dev_key`'s one-time sign-in)."""
    if not password:
        raise ValidationError("The password must not be empty.")
    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        raise ValidationError(f"No user '{username}'.")
    validate_password(password, user)  # AUTH_PASSWORD_VALIDATORS: too short, too common, all digits, like the name
    user.set_password(password)
    user.save(update_fields=["password"])


@dataclass(frozen=True)
class NewApiKey:
    api_key: ApiKey
    token: str  # shown once, never stored


def api_key_name_taken(*, team: Team, name: str) -> bool:
    """Whether a live (unrevoked) key of the team already has this name, in any case."""
    return ApiKey.objects.filter(team=team, name__iexact=name, revoked_at__isnull=True).exists()


def api_key_create(
    *,
    team: Team,
    name: str,
    scopes: list[str] | None = None,
    environment=None,
    expires_at: datetime | None = None,
    created_by=None,
) -> NewApiKey:
    name = name.strip()
    if not name:
        raise ValidationError("A key needs a name.")
    scopes = list(scopes) if scopes is not None else [ApiKey.Scope.SESSIONS.value]
    unknown = sorted(set(scopes) - set(ALL_SCOPES))
    if unknown:
        raise ValidationError(f"Unknown scopes: {', '.join(unknown)}. Known: {', '.join(ALL_SCOPES)}.")
    if environment is not None and environment.team_id != team.id and environment.visibility != "public":
        raise ValidationError("A key can only be bound to its team's environments or public ones.")
    taken = ValidationError(f"The team already has a key named '{name}': choose another name or revoke that key.",
                            code="name_taken")
    if api_key_name_taken(team=team, name=name):
        raise taken
    try:
        with transaction.atomic():
            for _ in range(5):
                prefix = pysecrets.token_hex(4)
                if not ApiKey.objects.filter(prefix=prefix).exists():
                    break
            secret = pysecrets.token_hex(16)
            key = ApiKey.objects.create(
                team=team, name=name, prefix=prefix, secret_hash=hash_secret(secret), scopes=scopes,
                environment=environment, expires_at=expires_at, created_by=created_by,
            )
    except IntegrityError:
        # Two creations of one name raced past the check above; the constraint let one through.
        if api_key_name_taken(team=team, name=name):
            raise taken from None
        raise
    return NewApiKey(api_key=key, token=f"ors_{prefix}_{secret}")


def api_key_revoke(*, api_key: ApiKey) -> ApiKey:
    if api_key.revoked_at is None:
        api_key.revoked_at = timezone.now()
        api_key.save(update_fields=["revoked_at"])
    return api_key


def api_key_rotate_unowned(*, team: Team, name: str, scopes: list[str]) -> NewApiKey:
    """A fresh key named `name` for the team, revoking the earlier ones of that name that no person
    created (the one `make run` prints: each run replaces the last, so one full-scope dev key is active).
    A person's live key of that name is left alone, and the new key is then named `<name> (unowned)`."""
    fallback = f"{name} (unowned)"
    with transaction.atomic():
        ApiKey.objects.filter(team=team, name__in=[name, fallback], created_by__isnull=True,
                              revoked_at__isnull=True).update(revoked_at=timezone.now())
        free = not api_key_name_taken(team=team, name=name)
        return api_key_create(team=team, name=name if free else fallback, scopes=scopes)


def api_keys_touch(*, last_used: dict[int, datetime]) -> None:
    """Record last use for many keys at once; the auth layer coalesces uses in memory."""
    for key_id, when in last_used.items():
        ApiKey.objects.filter(id=key_id).update(last_used_at=when)
