"""What a deployment must set before anything starts: checked when the settings are imported, so
uvicorn, daphne, manage.py and Celery all refuse the same way (Django's system checks do not run
under an ASGI server). Nothing here needs Django set up: the settings module calls it first."""

from __future__ import annotations

from collections.abc import Mapping

from django.core.exceptions import ImproperlyConfigured

from orsplatform.config import DEVELOPMENT_SECRET_KEY  # public, so forgeable: refused below

__all__ = ["DEVELOPMENT_SECRET_KEY", "deployment_problems", "is_deployment", "refuse_insecure_deployment"]

_TRUE = {"1", "true", "yes", "on"}


def is_deployment(environ: Mapping[str, str]) -> bool:
    """Anything but the embedded default: an operator who set a SECRET_KEY, turned on the TLS
    settings, or said so outright."""
    return ("SECRET_KEY" in environ
            or environ.get("ORS_SECURE_COOKIES", "").strip().lower() in _TRUE
            or environ.get("ORS_DEPLOYMENT", "").strip().lower() == "production")


def deployment_problems(environ: Mapping[str, str]) -> list[str]:
    """Why this environment must not start (empty when it may)."""
    problems: list[str] = []
    secret_key = environ.get("SECRET_KEY")
    hosts = [h for h in environ.get("ALLOWED_HOSTS", "").split(",") if h.strip()]
    if secret_key is not None and not hosts:
        problems.append("SECRET_KEY is set but ALLOWED_HOSTS is not: set ALLOWED_HOSTS to the comma-separated "
                        "host names this server answers for (e.g. ALLOWED_HOSTS=ors.example.com).")
    if not is_deployment(environ):
        return problems
    if not secret_key or not secret_key.strip():
        problems.append("This is a deployment (ORS_DEPLOYMENT=production or ORS_SECURE_COOKIES on) but SECRET_KEY "
                        "is not set, so the public development key would sign sessions and, through "
                        "ORS_AGENT_KEY_SECRET's fallback, encrypt agents' keys: set SECRET_KEY to a long random "
                        "string.")
    elif secret_key == DEVELOPMENT_SECRET_KEY:
        problems.append("SECRET_KEY is the public development key: set SECRET_KEY to a long random string.")
    if "*" in (h.strip() for h in hosts):
        problems.append("ALLOWED_HOSTS is '*', which answers (and echoes into links) any Host header: name the "
                        "host names this server answers for.")
    agent_secret = environ.get("ORS_AGENT_KEY_SECRET")
    if agent_secret is not None and not agent_secret.strip():
        problems.append("ORS_AGENT_KEY_SECRET is set but empty: set it to a long random string (or unset it "
                        "to use SECRET_KEY).")
    if agent_secret == DEVELOPMENT_SECRET_KEY:
        problems.append("ORS_AGENT_KEY_SECRET is the public development key: set it to a long random string "
                        "(or unset it to use SECRET_KEY).")
    return problems


def refuse_insecure_deployment(environ: Mapping[str, str]) -> None:
    problems = deployment_problems(environ)
    if problems:
        raise ImproperlyConfigured("Refusing to start: " + " ".join(problems) + " See docs/accounts.md.")
