from __future__ import annotations

from django import forms
from django.conf import settings

from orsplatform.catalog.models import Environment
from orsplatform.teams.models import ApiKey, Team


class ApiKeyForm(forms.Form):
    name = forms.CharField(max_length=100)
    scopes = forms.MultipleChoiceField(choices=ApiKey.Scope.choices, widget=forms.CheckboxSelectMultiple,
                                       initial=[ApiKey.Scope.SESSIONS],
                                       help_text="Grant only what the key's user needs.")
    expires_in_days = forms.IntegerField(min_value=1, max_value=3650, required=False,
                                         help_text="Leave empty for a key that does not expire.")
    environment = forms.ModelChoiceField(queryset=Environment.objects.none(), required=False,
                                         help_text="Bind the key to one environment: it may use no other.")

    def __init__(self, *args, team: Team, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["environment"].queryset = Environment.objects.filter(team=team, deleted_at__isnull=True).order_by("slug")


class VerifySettingsForm(forms.Form):
    """An environment's replay settings (orsplatform/verify/): empty fields fall back to the
    manifest's [verify] table, then to the platform's default."""

    sample_size = forms.IntegerField(min_value=0, required=False, label="Episodes replayed",
                                     help_text="Recorded episodes of the current version replayed against "
                                               "each new version (0: none).")
    threshold = forms.FloatField(min_value=0, max_value=1, required=False, label="Threshold",
                                 help_text="Agreement (0–1) below which a new version waits for your "
                                           "confirmation before it is served.")
    report_only = forms.BooleanField(required=False, label="Report only",
                                     help_text="Never hold a version for its agreement (reference "
                                               "solutions still must pass).")

    def clean_sample_size(self) -> int | None:
        value = self.cleaned_data["sample_size"]
        if value is not None and value > settings.ORS_REPLAY_MAX_SAMPLE:
            raise forms.ValidationError(f"At most {settings.ORS_REPLAY_MAX_SAMPLE} episodes.")
        return value
