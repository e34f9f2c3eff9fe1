"""Two training runs logged by the unmodified `openreward` client to a live server, then read in a
real browser (headless Chromium): the runs list, the two runs overlaid, a point's trajectories and a
rollout's messages. The screenshot of the overlay lands in test-artifacts/runs/."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from django.contrib.auth import get_user_model
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import Select, WebDriverWait

from orsplatform.runs.models import Rollout, Run
from tests.analytics import test_browser as analytics_browser
from tests.analytics.log_two_runs import GROUP, RATES, reward
from tests.analytics.test_browser import CHROMEDRIVER, CHROMIUM, PASSWORD, browser  # noqa: F401 (fixture)
from tests.fixtures.server import ROOT

pytestmark = pytest.mark.e2e
STEPS = 12


@pytest.fixture(autouse=True)
def _chromium_installed():
    from pathlib import Path

    assert Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists(), "apt-get install chromium chromium-driver"


def screenshot(driver, name: str) -> None:
    analytics_browser.ARTIFACTS = ROOT / "test-artifacts" / "runs"
    analytics_browser.screenshot(driver, name)


@pytest.fixture
def logged(owner, server_factory):
    """A live server, and the two runs logged into it by the openreward client in its own process."""
    site = server_factory()
    env = {**os.environ, "OPENREWARD_API_URL": site.url, "OPENREWARD_API_KEY": owner.token,
           "OPENREWARD_DISABLE_UPDATE_CHECK": "1", "OPENREWARD_URL": site.url}
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "analytics" / "log_two_runs.py"), str(STEPS)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    print(f"the client logged {2 * STEPS * GROUP} rollouts in {time.monotonic() - started:.1f} s")
    for name in RATES:
        assert Rollout.objects.filter(team=owner.team, run__name=name).count() == STEPS * GROUP, name
    user = get_user_model().objects.get(username=owner.username)
    user.set_password(PASSWORD)
    user.save()
    return site


def test_a_researcher_overlays_two_runs_and_opens_a_points_trajectories(logged, owner, browser):  # noqa: F811
    browser.get(f"{logged.url}/accounts/login/?next=/analytics/")
    browser.find_element(By.ID, "id_username").send_keys(owner.username)
    browser.find_element(By.ID, "id_password").send_keys(PASSWORD)
    browser.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()
    WebDriverWait(browser, 15).until(EC.presence_of_element_located((By.ID, "site-nav-runs")))

    browser.find_element(By.ID, "site-nav-runs").click()  # from the site navigation
    WebDriverWait(browser, 15).until(EC.presence_of_element_located((By.ID, "runs")))
    names = [a.text for a in browser.find_elements(By.CSS_SELECTOR, "a.run-link")]
    assert set(RATES) <= set(names)
    for box in browser.find_elements(By.CSS_SELECTOR, "input.run-pick"):
        if box.get_attribute("value") in RATES:
            box.click()
    browser.find_element(By.ID, "compare").click()
    WebDriverWait(browser, 15).until(EC.presence_of_element_located((By.ID, "legend")))
    Select(browser.find_element(By.ID, "f-smooth")).select_by_value("0.6")
    browser.find_element(By.CSS_SELECTOR, "#run-filters button[type=submit]").click()
    WebDriverWait(browser, 15).until(EC.url_contains("smooth=0.6"))

    found = analytics_browser.assert_charts_drawn(browser, 4)
    assert {c["figure"] for c in found} == {"run-reward", "run-pass-rate", "run-length", "run-errors"}
    legend = [li.text.split()[0] for li in browser.find_elements(By.CSS_SELECTOR, "#legend li")]
    assert sorted(legend) == sorted(RATES)  # both runs, one colour each, in the legend's order below
    curves = browser.execute_script("""
        const svg = document.querySelector('figure[data-chart="run-reward"] svg');
        return [0, 1].map(c => [...svg.querySelectorAll(`.mark[data-curve="${c}"]`)].map(
            m => [Number(m.dataset.x), Number(m.dataset.value)]));""")
    for curve, run in zip(curves, legend, strict=True):
        assert [x for x, _ in curve] == list(range(STEPS)), run
        for step, value in curve:
            assert value == pytest.approx(sum(reward(run, int(step), j) for j in range(GROUP)) / GROUP), (run, step)
    assert len(browser.find_elements(By.CSS_SELECTOR, 'figure[data-chart="run-reward"] polyline.line')) == 2
    screenshot(browser, "01-two-runs-overlaid")

    # A point is its step's group of rollouts: clicking it lists them, each opens its messages.
    point = browser.find_element(By.CSS_SELECTOR, 'figure[data-chart="run-reward"] a.point-link circle[data-x="5"]')
    browser.execute_script("arguments[0].dispatchEvent(new MouseEvent('click', {bubbles: true}))", point)
    WebDriverWait(browser, 15).until(EC.presence_of_element_located((By.ID, "episodes")))
    rows = browser.find_elements(By.CSS_SELECTOR, "#episodes tr.episode-row")
    assert len(rows) == GROUP and all(r.find_elements(By.CSS_SELECTOR, "td")[2].text == "5" for r in rows)
    screenshot(browser, "02-a-points-episodes")
    browser.find_elements(By.CSS_SELECTOR, "a.trajectory-link")[0].click()
    WebDriverWait(browser, 15).until(EC.presence_of_element_located((By.ID, "messages")))
    texts = [li.text for li in browser.find_elements(By.CSS_SELECTOR, "#messages li.message")]
    assert len(texts) == 3 and "What is 5 +" in texts[1]
    screenshot(browser, "03-rollout-trajectory")
    assert Run.objects.filter(team=owner.team, name__in=list(RATES)).count() == 2
