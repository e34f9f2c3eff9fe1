"""API-key authentication for the REST API: DRF's adapters over ``teams.auth`` (the same keys and
the same access policy as the ORS surface)."""

from __future__ import annotations

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework.authentication import BaseAuthentication
from rest_framework.exceptions import AuthenticationFailed, NotAuthenticated, PermissionDenied
from rest_framework.permissions import BasePermission

from orsplatform.teams.auth import (
    ANONYMOUS,
    Access,
    AccessDenied,
    AuthError,
    Caller,
    admit,
    extract_token,
    identify,
)


class ApiPrincipal:
    """request.user for a key-authenticated request: the team behind the key."""

    is_authenticated = True
    is_anonymous = False

    def __init__(self, caller: Caller) -> None:
        self.caller = caller

    def __str__(self) -> str:
        return f"team:{self.caller.team_slug}"


class ApiKeyAuthentication(BaseAuthentication):
    def authenticate(self, request):
        headers = {}
        for meta, name in (("HTTP_X_API_KEY", b"x-api-key"), ("HTTP_AUTHORIZATION", b"authorization")):
            if meta in request.META:
                headers[name] = request.META[meta].encode("latin-1", "replace")
        try:
            token = extract_token(headers)
            if token is None:
                return None
            caller = identify(token)
        except AuthError as exc:
            raise AuthenticationFailed(str(exc)) from None
        return ApiPrincipal(caller), caller

    def authenticate_header(self, request) -> str:
        return 'Bearer realm="api"'  # makes DRF answer 401, not 403, without a key


def caller_of(request) -> Caller:
    return request.auth if isinstance(request.auth, Caller) else ANONYMOUS


def authorize_request(request, access: Access) -> Caller:
    """teams.auth's policy for a DRF request, as DRF's exceptions (401 without a key, 403 without
    the scope)."""
    try:
        return admit(request.auth if isinstance(request.auth, Caller) else None, access)
    except AccessDenied as exc:
        raise PermissionDenied(str(exc)) from None
    except AuthError as exc:
        raise NotAuthenticated(str(exc)) from None


class CatalogAccess(BasePermission):
    """Reading the catalog: any key, or anonymous when ORS_ANONYMOUS_CATALOG allows it."""

    def has_permission(self, request, view) -> bool:
        authorize_request(request, Access.CATALOG)
        return True


class TeamAccess(BasePermission):
    """Team data (sessions, the audit log): a key with the sessions scope."""

    def has_permission(self, request, view) -> bool:
        authorize_request(request, Access.TEAM)
        return True


class ApiKeyScheme(OpenApiAuthenticationExtension):
    """Documents the API-key header in the OpenAPI schema (and the Swagger UI's Authorize button)."""

    target_class = "orsplatform.api.auth.ApiKeyAuthentication"
    name = "ApiKey"

    def get_security_definition(self, auto_schema):
        return {"type": "apiKey", "in": "header", "name": "X-API-Key",
                "description": "ors_<prefix>_<secret>; `Authorization: Bearer <key>` works too."}
