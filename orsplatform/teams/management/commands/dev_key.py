import os
import secrets

from django.conf import settings
from django.contrib.auth.tokens import default_token_generator
from django.core.management.base import BaseCommand
from django.urls import reverse
from django.utils.encoding import force_bytes
from django.utils.http import urlsafe_base64_encode

from orsplatform.teams.models import Membership
from orsplatform.teams.services import (
    api_key_rotate_unowned,
    membership_add,
    team_get_or_create_builtin,
    user_set_password,
)

DEV_USER = "dev"
DEV_KEY_NAME = "make run"


class Command(BaseCommand):
    help = ("Print a development API key for the built-in team and, on the embedded default, a one-time "
            "sign-in link and a fresh password for its owner (used by `make run`).")

    def add_arguments(self, parser):
        # `make run` exports neither HOST nor PORT unless the user set them; its defaults are these.
        default = f"http://{os.environ.get('HOST', '127.0.0.1')}:{os.environ.get('PORT', '8000')}"
        parser.add_argument("--base-url", default=default, help=f"where the server listens (default {default})")

    def handle(self, *args, base_url: str, **options):
        team = team_get_or_create_builtin(slug=settings.ORS_BUILTIN_TEAM)
        base_url = base_url.rstrip("/")
        if settings.ORS_DEV_LOGIN:
            membership = membership_add(team=team, username=DEV_USER, role=Membership.Role.OWNER)
            # A fresh password every run: an old printout stops working at the next `make run`.
            password = secrets.token_urlsafe(12)
            user_set_password(username=DEV_USER, password=password)
            user = membership.user
            user.refresh_from_db()
            # A password-reset token: it dies once used (signing in changes last_login), when the
            # password changes, and after PASSWORD_RESET_TIMEOUT.
            link = reverse("dev_login", args=[urlsafe_base64_encode(force_bytes(user.pk)),
                                              default_token_generator.make_token(user)])
            self.stdout.write(f"Console: {base_url}/console/")
            self.stdout.write(f"Sign in as '{DEV_USER}', owner of team '{team.slug}':")
            self.stdout.write(f"  one-time link: {base_url}{link}")
            self.stdout.write(f"  or at {base_url}/accounts/login/ with password: {password}")
        # Only a hash of a key is kept, so the last run's key cannot be printed again: it is replaced,
        # and the keys earlier runs printed stop working (one full-scope dev key at a time).
        new = api_key_rotate_unowned(team=team, name=DEV_KEY_NAME, scopes=["sessions", "publish", "manage"])
        self.stdout.write(f"Development API key for team '{team.slug}' (shown once; earlier ones are revoked):")
        self.stdout.write(new.token)
