from __future__ import annotations

from django import forms

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
        self.fields["environment"].queryset = Environment.objects.filter(team=team).order_by("slug")
