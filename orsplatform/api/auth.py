"""API-key authentication for the REST API (the same keys and rules as the ORS surface)."""

from __future__ import annotations

from django.conf import settings
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework.authentication import BaseAuthentication
from rest_framework.exceptions import AuthenticationFailed, NotAuthenticated, PermissionDenied
from rest_framework.permissions import BasePermission

from orsplatform.teams.auth import ANONYMOUS, AuthError, Caller, authenticate_token_sync, extract_token


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
            caller = authenticate_token_sync(token)
        except AuthError as exc:
            raise AuthenticationFailed(str(exc)) from None
        return ApiPrincipal(caller), caller

    def authenticate_header(self, request) -> str:
        return 'Bearer realm="api"'  # makes DRF answer 401, not 403, without a key


def caller_of(request) -> Caller:
    return request.auth if isinstance(request.auth, Caller) else ANONYMOUS


class CatalogAccess(BasePermission):
    """Reading the catalog: any key, or anonymous when ORS_ANONYMOUS_CATALOG allows it."""

    def has_permission(self, request, view) -> bool:
        if isinstance(request.auth, Caller) or settings.ORS_ANONYMOUS_CATALOG:
            return True
        raise NotAuthenticated("An API key is required (X-API-Key or Authorization: Bearer).")


def require_scope(request, scope: str) -> Caller:
    """The request's key, which must carry `scope` (401 without a key, 403 without the scope)."""
    caller = request.auth
    if not isinstance(caller, Caller):
        raise NotAuthenticated("An API key is required (X-API-Key or Authorization: Bearer).")
    if not caller.can(scope):
        raise PermissionDenied(f"This API key lacks the '{scope}' scope.")
    return caller


class TeamAccess(BasePermission):
    """Team data (sessions, the audit log): a key with the sessions scope."""

    def has_permission(self, request, view) -> bool:
        require_scope(request, "sessions")
        return True


class ApiKeyScheme(OpenApiAuthenticationExtension):
    """Documents the API-key header in the OpenAPI schema (and the Swagger UI's Authorize button)."""

    target_class = "orsplatform.api.auth.ApiKeyAuthentication"
    name = "ApiKey"

    def get_security_definition(self, auto_schema):
        return {"type": "apiKey", "in": "header", "name": "X-API-Key",
                "description": "ors_<prefix>_<secret>; `Authorization: Bearer <key>` works too."}
