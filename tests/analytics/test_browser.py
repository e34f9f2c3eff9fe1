"""The analytics pages in a real browser: headless Chromium (the Debian package, driven by Selenium)
against a real daphne server on the test database. Screenshots land in test-artifacts/analytics/."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

from orsplatform.analytics.services import tool_call_rollup_run
from tests.analytics.seed import seed
from tests.fixtures.server import ROOT

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
ARTIFACTS = ROOT / "test-artifacts" / "analytics"
PASSWORD = "correct horse battery staple"

pytestmark = pytest.mark.e2e


@pytest.fixture(autouse=True)
def _chromium_installed():
    # No skip: a browser test that did not run proves nothing. .ci/run installs the packages.
    assert Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists(), (
        "the browser tests need Debian's chromium and chromium-driver: apt-get install chromium chromium-driver")


@pytest.fixture
def browser(tmp_path):
    options = Options()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--no-first-run", "--window-size=1366,900", f"--user-data-dir={tmp_path / 'chromium-profile'}"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


@pytest.fixture
def site(owner, outsider, server_factory):
    """Seeded data, folded rollups, a user with a password, and a live daphne server."""
    seed(acme=owner.team, globex=outsider.team)
    tool_call_rollup_run(settle=0)
    user = get_user_model().objects.get(username=owner.username)
    user.set_password(PASSWORD)
    user.save()
    return server_factory()


def screenshot(driver, name: str) -> Path:
    """A full-page screenshot (Chromium's DevTools protocol captures beyond the viewport)."""
    import base64

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


def charts(driver) -> list[dict]:
    return driver.execute_script("""
        return [...document.querySelectorAll('svg.chart')].map(svg => ({
            id: svg.id, empty: svg.dataset.empty, marks: svg.querySelectorAll('.mark').length,
            title: svg.querySelector('title').textContent,
            axisLabels: [...svg.querySelectorAll('.axis-label')].map(t => t.textContent),
            width: svg.getBoundingClientRect().width, height: svg.getBoundingClientRect().height,
            figure: svg.closest('figure') ? svg.closest('figure').dataset.chart : null,
        }));""")


def assert_charts_drawn(driver, expected: int) -> list[dict]:
    found = charts(driver)
    assert len(found) == expected, found
    for chart in found:
        assert chart["empty"] == "false" and chart["marks"] > 0, chart
        assert chart["width"] > 200 and chart["height"] > 80, chart
        assert chart["axisLabels"] and all(chart["axisLabels"]), chart
    return found


def log_in(driver, url: str) -> None:
    driver.get(f"{url}/accounts/login/?next=/analytics/")
    driver.find_element(By.ID, "id_username").send_keys("alice")
    driver.find_element(By.ID, "id_password").send_keys(PASSWORD)
    driver.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()
    WebDriverWait(driver, 15).until(EC.presence_of_element_located((By.ID, "overview-tiles")))


def test_a_user_clicks_from_the_overview_to_an_environment_to_a_trajectory(site, browser):
    log_in(browser, site.url)
    assert "/analytics/acme/" in browser.current_url
    assert browser.find_element(By.ID, "tile-sessions").text == "13"
    assert browser.find_element(By.LINK_TEXT, "Analytics").is_displayed()  # in the site navigation
    found = assert_charts_drawn(browser, 2)  # environments and keys are tables, not charts too
    assert {c["figure"] for c in found} == {"sessions-per-period", "calls-per-period"}
    screenshot(browser, "01-overview")

    browser.find_element(By.LINK_TEXT, "acme/puzzle").click()
    WebDriverWait(browser, 15).until(EC.presence_of_element_located((By.ID, "tile-success")))
    assert "/environments/acme/puzzle/" in browser.current_url
    found = assert_charts_drawn(browser, 5)
    assert any("Latency (ms)" in c["axisLabels"] for c in found)
    assert browser.find_element(By.ID, "tile-success").text == "41.7%"
    screenshot(browser, "02-environment")

    browser.find_element(By.LINK_TEXT, "1").click()  # version 1 only
    WebDriverWait(browser, 15).until(EC.url_contains("version=1"))
    assert browser.find_element(By.ID, "tile-latency").text == "50 ms / 95 ms / 99 ms"
    browser.find_element(By.ID, "explore-sessions").click()
    WebDriverWait(browser, 15).until(EC.presence_of_element_located((By.ID, "sessions")))
    assert len(browser.find_elements(By.CSS_SELECTOR, "a.session-link")) == 10
    screenshot(browser, "03-explorer")

    browser.find_element(By.PARTIAL_LINK_TEXT, "acme-puzzle-0").click()
    WebDriverWait(browser, 15).until(EC.presence_of_element_located((By.ID, "trajectory")))
    assert len(browser.find_elements(By.CSS_SELECTOR, "#trajectory li.call")) == 5
    image = browser.find_element(By.CSS_SELECTOR, "#prompt img.block-image")
    assert browser.execute_script("return arguments[0].complete && arguments[0].naturalWidth", image) == 48
    assert_charts_drawn(browser, 1)
    screenshot(browser, "04-trajectory")


def test_every_time_range_and_bad_filters_render_in_the_browser(site, browser):
    log_in(browser, site.url)
    for label in ("24 hours", "7 days", "90 days", "All time"):
        browser.find_element(By.CSS_SELECTOR, f'a.range-link[data-range="{label}"]').click()
        WebDriverWait(browser, 15).until(EC.presence_of_element_located((By.CSS_SELECTOR, "a.range-link.active")))
        assert browser.find_element(By.CSS_SELECTOR, "a.range-link.active").text == label
        assert_charts_drawn(browser, 2)
    screenshot(browser, "05-overview-all-time")

    browser.get(f"{site.url}/analytics/acme/sessions/")
    start = browser.find_element(By.ID, "range-start")
    start.send_keys("2024-02-30")
    browser.find_element(By.CSS_SELECTOR, "form.range button[type=submit]").click()
    error = WebDriverWait(browser, 15).until(EC.presence_of_element_located((By.ID, "filter-errors")))
    assert "is not a valid date" in error.text
    screenshot(browser, "06-bad-filter")

    browser.get(f"{site.url}/analytics/acme/environments/builtin/wordle/")
    empty = charts(browser)
    assert len(empty) == 5 and all(c["empty"] == "true" and c["marks"] == 0 for c in empty)
    assert "No data in this time range." in browser.page_source
    screenshot(browser, "07-empty-environment")
