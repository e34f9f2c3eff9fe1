from django.urls import path

from orsplatform.runs import rollout_api

# At the root because the openreward client joins absolute paths to OPENREWARD_API_URL (aiohttp's
# base_url drops any path of its own).
urlpatterns = [
    path("rollouts", rollout_api.rollouts, name="rollout-api-rollouts"),
    path("environments/<str:owner>/<str:name>", rollout_api.environment, name="rollout-api-environment"),
    path("environments/<str:owner>/<str:name>/variants", rollout_api.variants, name="rollout-api-variants"),
]
