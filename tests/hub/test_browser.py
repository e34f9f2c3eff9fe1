"""A newcomer in a real browser (headless Chromium driven by Selenium, against a daphne server on the
test database): signs in with what `make run` prints, opens the catalog, searches, reads an
environment's README, browses its tasks, diffs two versions and follows a hardest task to its
sessions. Screenshots land in test-artifacts/hub/ (gitignored)."""

from __future__ import annotations

import base64
import io
import re
from pathlib import Path

import pytest
from django.core.management import call_command
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

from orsplatform.teams.models import Membership
from orsplatform.teams.services import membership_add
from tests.analytics.test_browser import _chromium_installed  # noqa: F401 (an autouse fixture)
from tests.fixtures.server import ROOT

ARTIFACTS = ROOT / "test-artifacts" / "hub"

pytestmark = pytest.mark.e2e


def screenshot(driver, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    size = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
        "width": 1366, "height": min(int(size["height"]) + 1, 8000), "deviceScaleFactor": 1, "mobile": False})
    try:
        shot = driver.execute_cdp_cmd("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})
    finally:
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    path = ARTIFACTS / f"{name}.png"
    path.write_bytes(base64.b64decode(shot["data"]))
    return path


def wait_for(driver, by, value, seconds: float = 15):
    return WebDriverWait(driver, seconds).until(EC.presence_of_element_located((by, value)))


@pytest.fixture
def printed(hub, server_factory):
    """A server, and what `make run` prints for it (its dev_key step); the newcomer has been added to
    team acme, whose environments and sessions the hub fixture made."""
    server = server_factory(ORS_DEV_LOGIN="1", ORS_LIVE_REFRESH_SECONDS="1")
    out = io.StringIO()
    call_command("dev_key", base_url=server.url, stdout=out)
    membership_add(team=hub.private.team, username="dev", role=Membership.Role.MEMBER)
    return server, out.getvalue()


def test_a_newcomer_signs_in_from_what_make_run_prints_and_explores_an_environment(printed, browser):
    server, output = printed
    link = re.search(r"one-time link: (\S+)", output).group(1)
    assert link.startswith(server.url) and f"Console: {server.url}/console/" in output

    browser.get(server.url + "/")
    assert browser.find_element(By.ID, "home-login").is_displayed()
    assert browser.find_element(By.CSS_SELECTOR, 'a.env-link[href="/environments/builtin/math/"]')
    screenshot(browser, "01-home")

    browser.get(link)
    wait_for(browser, By.ID, "signed-in-as")
    assert browser.find_element(By.ID, "signed-in-as").text == "dev" and "/console/" in browser.current_url
    screenshot(browser, "02-console")

    browser.find_element(By.ID, "nav-environments").click()
    wait_for(browser, By.ID, "catalog-search")
    search = browser.find_element(By.ID, "c-q")
    search.send_keys("quiz")
    browser.find_element(By.CSS_SELECTOR, "#catalog-search button[type=submit]").click()
    WebDriverWait(browser, 15).until(EC.url_contains("q=quiz"))
    cards = browser.find_elements(By.CSS_SELECTOR, "#environment-cards a.env-link")
    assert [c.text for c in cards] == ["acme/quiz"]
    screenshot(browser, "03-catalog-search")

    cards[0].click()
    readme = wait_for(browser, By.ID, "readme")
    assert "Say the word of the task." in readme.text
    assert browser.title != "pwned" and not browser.find_elements(By.CSS_SELECTOR, "#readme script, #readme img")
    assert browser.find_element(By.ID, "snippet-ors").is_displayed()
    screenshot(browser, "04-environment")

    browser.find_element(By.ID, "tab-tasks").click()
    wait_for(browser, By.ID, "tasks")
    rows = browser.find_elements(By.CSS_SELECTOR, "#tasks a.task-link")
    assert [r.text for r in rows] == ["#0", "#1", "#2"]
    assert "trainword1" in browser.find_element(By.ID, "tasks").text
    screenshot(browser, "05-tasks")
    rows[2].click()
    wait_for(browser, By.ID, "task-spec")
    assert "trainword2" in browser.find_element(By.ID, "task-spec").text
    assert "Say trainword2 (two)" in browser.find_element(By.ID, "task-prompt").text
    browser.find_element(By.CSS_SELECTOR, "#render-form button[type=submit]").click()
    rendered = wait_for(browser, By.ID, "task-rendered-prompt", seconds=30)
    assert "Say trainword2 (two)" in rendered.text
    screenshot(browser, "06-task")

    browser.find_element(By.ID, "tab-versions").click()
    wait_for(browser, By.ID, "diff-form")
    browser.find_element(By.CSS_SELECTOR, "#diff-form button[type=submit]").click()
    summary = wait_for(browser, By.ID, "diff-summary")
    assert "2 files changed" in summary.text
    added = browser.find_elements(By.CSS_SELECTOR, ".diff .add")
    assert any("Now with version two." in line.text for line in added)
    screenshot(browser, "07-diff")

    browser.find_element(By.ID, "tab-analytics").click()
    wait_for(browser, By.ID, "hardest-tasks")
    hardest = browser.find_element(By.ID, "hardest-tasks")
    assert "trainword1" in hardest.text  # the hardest task, by its text
    screenshot(browser, "08-analytics")
    hardest.find_element(By.CSS_SELECTOR, "a.task-sessions").click()
    wait_for(browser, By.ID, "sessions")
    sids = [a.text for a in browser.find_elements(By.CSS_SELECTOR, "#sessions a.session-link")]
    assert sorted(sids) == ["quiz-2", "quiz-3"]
    assert {s.text for s in browser.find_elements(By.CSS_SELECTOR, "#sessions .status")} == {"finished"}
    screenshot(browser, "09-hardest-task-sessions")


def test_chart_points_show_their_value_on_hover(printed, browser):
    from selenium.webdriver.common.action_chains import ActionChains

    server, output = printed
    browser.get(re.search(r"one-time link: (\S+)", output).group(1))
    wait_for(browser, By.ID, "signed-in-as")
    browser.get(server.url + "/analytics/acme/environments/acme/quiz/?range=24h")
    mark = wait_for(browser, By.CSS_SELECTOR, 'figure[data-chart="mean-reward"] .mark')
    ActionChains(browser).move_to_element(mark).perform()
    tip = WebDriverWait(browser, 10).until(
        lambda d: d.find_element(By.CSS_SELECTOR, 'figure[data-chart="mean-reward"] .chart-tip'))
    WebDriverWait(browser, 10).until(lambda d: tip.is_displayed() and "Mean reward" in tip.text)
    assert "minute" in browser.find_element(By.CSS_SELECTOR, 'figure[data-chart="mean-reward"] .axis-label').text
    screenshot(browser, "10-chart-tooltip")


def test_a_page_with_a_run_in_progress_updates_its_figures_without_a_reload(printed, browser, hub):
    from django.utils import timezone

    from orsplatform.episodes.models import Session

    server, output = printed
    running = Session.objects.filter(environment=hub.private).first()
    Session.objects.filter(pk=running.pk).update(status="ready", ended_at=None, total_reward=None)
    browser.get(re.search(r"one-time link: (\S+)", output).group(1))
    wait_for(browser, By.ID, "signed-in-as")
    browser.get(server.url + "/analytics/acme/?range=24h")
    assert wait_for(browser, By.ID, "tile-open").text == "1"
    assert browser.find_element(By.ID, "live").get_attribute("data-live") == "true"
    browser.execute_script("window.notReloaded = true")
    Session.objects.filter(pk=running.pk).update(status="deleted", ended_at=timezone.now(), total_reward=1.0)
    WebDriverWait(browser, 15).until(lambda d: d.find_element(By.ID, "tile-open").text == "0")
    assert browser.find_element(By.ID, "live").get_attribute("data-live") == "false"
    assert browser.execute_script("return window.notReloaded") is True  # swapped in place, no reload
    screenshot(browser, "11-live-refresh")
