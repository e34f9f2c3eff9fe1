"""The run page and the leaderboard in a real browser: headless Chromium (Debian's, driven by
Selenium) against a daphne server on the test database, which drives the run itself (eager Celery).
Screenshots land in test-artifacts/evals/."""

from __future__ import annotations

import time

import pytest
from django.contrib.auth import get_user_model
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import Select, WebDriverWait

from tests.analytics import test_browser as analytics_browser
from tests.analytics.test_browser import CHROMEDRIVER, CHROMIUM, PASSWORD, browser  # noqa: F401 (fixture)
from tests.evals.aap_agent import expected_reward
from tests.evals.conftest import register
from tests.fixtures.server import ROOT

pytestmark = pytest.mark.e2e
TASKS = 40


@pytest.fixture(autouse=True)
def _chromium_installed():
    from pathlib import Path

    assert Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists(), "apt-get install chromium chromium-driver"


def screenshot(driver, name: str) -> None:
    analytics_browser.ARTIFACTS = ROOT / "test-artifacts" / "evals"
    analytics_browser.screenshot(driver, name)


def test_a_user_launches_a_run_watches_it_and_reads_the_leaderboard(
        owner, agents, server_factory, browser, embedded_worker):  # noqa: F811 (the fixture imported above)
    register(owner, agents, "solver", "delta")
    user = get_user_model().objects.get(username=owner.username)
    user.set_password(PASSWORD)
    user.save()
    # As `make run` runs it: the run goes to the worker beside the server, so the page watches it
    # move (the suite's eager configuration would run it inside the launch request).
    allowed = {"ORS_EVAL_AGENT_ALLOWED_HOSTS": agents.url.removeprefix("http://")}
    embedded_worker.start(**allowed)
    site = server_factory(**allowed, **embedded_worker.env())

    browser.get(f"{site.url}/accounts/login/?next=/aap/")
    browser.find_element(By.ID, "id_username").send_keys(owner.username)
    browser.find_element(By.ID, "id_password").send_keys(PASSWORD)
    browser.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()
    WebDriverWait(browser, 15).until(EC.presence_of_element_located((By.ID, "launch")))
    Select(browser.find_element(By.ID, "id_agent")).select_by_visible_text("solver-delta")
    for field, value in (("id_stop", str(TASKS)), ("id_concurrency", "2")):
        browser.find_element(By.ID, field).clear()
        browser.find_element(By.ID, field).send_keys(value)
    browser.find_element(By.CSS_SELECTOR, "#launch button[type=submit]").click()
    WebDriverWait(browser, 15).until(EC.presence_of_element_located((By.ID, "progress")))
    assert "/aap/acme/runs/" in browser.current_url

    # The progress bar moves while the run goes on; the page reloads with the charts when it ends.
    seen: list[int] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            seen.append(int(browser.find_element(By.ID, "progress").get_attribute("value")))
            # The polling script writes "finished" into the page just before it reloads it, so the
            # final page is the one without the cancel button (rendered for an ended run).
            if browser.find_element(By.ID, "status").text == "finished" and not browser.find_elements(
                    By.ID, "cancel") and browser.find_elements(By.CSS_SELECTOR, "#histogram svg .mark"):
                break
        except Exception:  # the page is reloading
            pass
        time.sleep(0.1)  # polling interval while waiting on the condition
    else:
        raise AssertionError(f"the run page never showed a finished run (progress seen: {seen[-5:]})")
    assert min(seen) < TASKS, f"the bar never showed a run in progress: {seen[:5]}"
    assert int(browser.find_element(By.ID, "progress").get_attribute("value")) == TASKS
    passed = int(sum(expected_reward("test", i) for i in range(TASKS)))
    assert f"({passed} passed)" in browser.find_element(By.ID, "pass-rate").text
    bars = browser.find_elements(By.CSS_SELECTOR, "#histogram svg .mark")
    assert sorted(int(b.get_attribute("data-value")) for b in bars if b.get_attribute("data-value") != "0") == sorted(
        [passed, TASKS - passed])
    screenshot(browser, "01-run")

    browser.find_element(By.CSS_SELECTOR, "#slowest a").click()
    WebDriverWait(browser, 15).until(EC.presence_of_element_located((By.ID, "agent-transcript")))
    assert "My answer is" in browser.find_element(By.ID, "agent-transcript").text
    screenshot(browser, "02-trajectory")

    browser.get(f"{site.url}/aap/acme/")
    browser.find_element(By.PARTIAL_LINK_TEXT, "builtin/math · test").click()
    WebDriverWait(browser, 15).until(EC.presence_of_element_located((By.ID, "leaderboard")))
    rows = browser.find_elements(By.CSS_SELECTOR, "#leaderboard .board-row")
    assert len(rows) == 1 and "solver-delta" in rows[0].text and "@1" in rows[0].text
    assert f"{passed / TASKS * 100:.1f} %" in rows[0].find_element(By.CLASS_NAME, "pass-rate").text
    screenshot(browser, "03-leaderboard")
