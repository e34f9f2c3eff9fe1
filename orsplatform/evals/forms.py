from __future__ import annotations

from django import forms

from orsplatform.evals.aap import STREAM_MODES


class AgentForm(forms.Form):
    name = forms.CharField(max_length=100)
    url = forms.URLField(max_length=500, label="URL", help_text="The AAP server's base URL (GET <url>/meta).")
    agent = forms.CharField(max_length=200, help_text="The agent's name on that server.")
    api_key = forms.CharField(required=False, max_length=4000, label="API key",
                              widget=forms.PasswordInput(render_value=False))
    stream = forms.ChoiceField(choices=[(m, m) for m in STREAM_MODES], initial="none")


class RunForm(forms.Form):
    agent = forms.TypedChoiceField(coerce=int, choices=())
    environment = forms.CharField(max_length=200, initial="builtin/math", help_text="team/slug[@N]")
    split = forms.CharField(max_length=100, initial="test")
    start = forms.IntegerField(min_value=0, initial=0)
    stop = forms.IntegerField(min_value=1, initial=10)
    concurrency = forms.IntegerField(min_value=1, initial=4)
    max_turns = forms.IntegerField(min_value=1, initial=20)

    def __init__(self, *args, agents=(), **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["agent"].choices = [(a.id, a.name) for a in agents]
