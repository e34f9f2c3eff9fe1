"""Every kind of page at a phone's width (390 px) and a desktop's (1400 px), in a real browser (headless
Chromium driven by Selenium, against a daphne server on the test database): no page scrolls sideways,
tables scroll inside their own box, charts fit their card, and the navigation collapses into a menu
that opens on a phone. Screenshots of the catalog, an environment, a run and the session explorer at
both widths land in test-artifacts/responsive/ on every run, with the page load times observed."""

from __future__ import annotations

import base64
import json
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

from orsplatform.analytics.services import tool_call_rollup_run
from orsplatform.evals.models import Agent, EvalEpisode, EvalRun
from tests.analytics.runs_seed import seed_runs
from tests.analytics.test_browser import PASSWORD, _chromium_installed  # noqa: F401 (an autouse fixture)
from tests.fixtures.server import ROOT

ARTIFACTS = ROOT / "test-artifacts" / "responsive"
PHONE, DESKTOP = 390, 1400
HEIGHT = 860

pytestmark = pytest.mark.e2e


def pages(eval_run: int) -> list[tuple[str, str, str | None]]:
    """(kind, path, screenshot name or None): one page of every kind a signed-in member opens."""
    quiz = "/environments/acme/quiz"
    return [
        ("home", "/", None),
        ("hub catalog", "/environments/", "catalog"),
        ("environment page", f"{quiz}/", "environment"),
        ("environment tasks", f"{quiz}/tasks/", None),
        ("task", f"{quiz}/tasks/train/0/", None),
        ("environment versions", f"{quiz}/versions/", None),
        ("environment files", f"{quiz}/files/", None),
        ("version diff", f"{quiz}/diff/", None),
        ("console teams", "/console/", None),
        ("accounts and keys", "/console/acme/", None),
        ("console environments", "/console/acme/environments/", None),
        ("build page", "/console/acme/environments/quiz/versions/2/build", None),
        ("analytics overview", "/analytics/acme/?range=all", None),
        ("analytics environment", "/analytics/acme/environments/acme/quiz/?range=all", None),
        ("session explorer", "/analytics/acme/sessions/?range=all", "session-explorer"),
        ("session trajectory", "/analytics/acme/sessions/acme-linked-0/", None),
        ("training runs", "/analytics/acme/runs/", None),
        ("run page", "/analytics/acme/runs/view/?run=grpo-a&run=grpo-b", "run"),
        ("run episodes", "/analytics/acme/runs/episodes/?run=grpo-a&step=5", None),
        ("evaluations", "/aap/acme/", None),
        ("evaluation run", f"/aap/acme/runs/{eval_run}/", None),
        ("evaluation agents", "/aap/acme/agents/", None),
        ("leaderboard", "/aap/acme/leaderboard/acme/quiz/?split=train", None),
        ("not found", "/environments/acme/no-such-environment/", None),
    ]


def seed_evaluation(owner) -> EvalRun:
    """A finished evaluation of acme/quiz, written through the ORM (no agent server needed to look at it)."""
    quiz = owner.team.environments.get(slug="quiz")
    agent = Agent.objects.create(team=owner.team, name="solver", url="https://agent.example/aap", agent="solver")
    now = timezone.now()
    run = EvalRun.objects.create(team=owner.team, agent=agent, environment=quiz, version=quiz.current_version,
                                 split="train", start=0, stop=3, status=EvalRun.Status.FINISHED,
                                 started_at=now - timedelta(minutes=3), finished_at=now)
    for index, (reward, seconds) in enumerate([(1.0, 0.042), (0.0, 3.5), (1.0, 754.0)]):
        EvalEpisode.objects.create(run=run, task_index=index, status=EvalEpisode.Status.SCORED, reward=reward,
                                   passed=reward >= 1, finished=True, stop_reason="finished", turns=2, tool_calls=1,
                                   sid=f"quiz-{index}", started_at=now - timedelta(seconds=seconds), ended_at=now,
                                   duration_s=seconds)
    return run


@pytest.fixture
def site(hub, owner, outsider, server_factory):
    """The hub's environments and sessions, two training runs, an evaluation, folded rollups, a password
    for the owner, and a live server."""
    seed_runs(acme=owner.team, globex=outsider.team)
    run = seed_evaluation(owner)
    tool_call_rollup_run(settle=0)
    user = get_user_model().objects.get(username=owner.username)
    user.set_password(PASSWORD)
    user.save()
    return server_factory(), run


def viewport(driver, width: int) -> None:
    # A phone is emulated as one (mobile: the meta viewport applies, as on a real phone).
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
        "width": width, "height": HEIGHT, "deviceScaleFactor": 1, "mobile": width < 600})


def screenshot(driver, width: int, name: str) -> Path:
    """A full-page screenshot at this width (Chromium's DevTools protocol captures beyond the viewport)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    height = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]["height"]
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
        "width": width, "height": min(int(height) + 1, 8000), "deviceScaleFactor": 1, "mobile": width < 600})
    try:
        shot = driver.execute_cdp_cmd("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})
    finally:
        viewport(driver, width)
    path = ARTIFACTS / f"{name}-{width}.png"
    path.write_bytes(base64.b64decode(shot["data"]))
    return path


def log_in(driver, url: str, username: str) -> None:
    driver.get(f"{url}/accounts/login/?next=/console/")
    driver.find_element(By.ID, "id_username").send_keys(username)
    driver.find_element(By.ID, "id_password").send_keys(PASSWORD)
    driver.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()
    WebDriverWait(driver, 15).until(EC.presence_of_element_located((By.ID, "signed-in-as")))


LAYOUT = """
const width = arguments[0];
const doc = document.documentElement;
// What is wider than the screen must sit inside a box that scrolls (a table, a pre, a diff), never
// push the page: report every such element whose own box reaches past the screen's right edge.
const spills = [...document.querySelectorAll('main *, header.site *')].filter(el => {
  const box = el.getBoundingClientRect();
  if (box.width === 0 || box.right <= width + 1) return false;
  for (let up = el.parentElement; up && up !== document.body; up = up.parentElement) {
    const style = getComputedStyle(up);
    if (['auto', 'scroll', 'hidden'].includes(style.overflowX) && up.getBoundingClientRect().right <= width + 1)
      return false;
  }
  return true;
}).slice(0, 5).map(el => el.tagName.toLowerCase() + (el.id ? '#' + el.id : '') + '.' + el.className + ' '
                        + Math.round(el.getBoundingClientRect().right));
const nav = performance.getEntriesByType('navigation')[0];
return {
  scrollWidth: doc.scrollWidth, spills: spills,
  tables: [...document.querySelectorAll('main table')].map(t => {
    const box = t.closest('.table-scroll') || t;
    return Math.round(box.getBoundingClientRect().right);
  }),
  charts: [...document.querySelectorAll('svg.chart')].map(svg => ({
    width: svg.getBoundingClientRect().width,
    card: (svg.closest('figure') || svg.parentElement).getBoundingClientRect().width})),
  status: nav ? nav.responseStatus : null,
  loadMs: nav ? nav.loadEventEnd - nav.startTime : null,
  serverMs: nav ? nav.responseStart - nav.requestStart : null,
};
"""


def test_every_kind_of_page_fits_a_phone_and_a_desktop_without_sideways_scrolling(site, owner, browser):
    server, run = site
    log_in(browser, server.url, owner.username)
    timings: dict[str, dict[str, float]] = {}
    problems = []
    for width in (PHONE, DESKTOP):
        viewport(browser, width)
        for kind, path, shot in pages(run.id):
            browser.get(server.url + path)
            WebDriverWait(browser, 15).until(lambda d: d.execute_script("return document.readyState") == "complete")
            assert browser.find_elements(By.ID, "signed-in-as"), (kind, path, "not the site's page, or signed out")
            layout = browser.execute_script(LAYOUT, width)
            if layout["scrollWidth"] > width or layout["spills"]:
                problems.append((width, kind, path, layout["scrollWidth"], layout["spills"]))
            if any(right > width + 1 for right in layout["tables"]):
                problems.append((width, kind, path, "a table reaches past the screen", layout["tables"]))
            for chart in layout["charts"]:
                if chart["width"] > chart["card"] + 1 or chart["width"] > width or chart["width"] < 200:
                    problems.append((width, kind, path, "a chart does not fit its card", chart))
            if kind in ("run page", "analytics overview", "analytics environment"):
                assert layout["charts"], (kind, "draws no chart")
            timings.setdefault(kind, {})[str(width)] = round(layout["loadMs"] or 0, 1)
            if shot:
                screenshot(browser, width, shot)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "page-load-ms.json").write_text(json.dumps(timings, indent=1) + "\n")
    print(json.dumps(timings, indent=1))
    assert not problems, "\n".join(map(str, problems))
    for name in ("catalog", "environment", "run", "session-explorer"):
        for width in (PHONE, DESKTOP):
            assert (ARTIFACTS / f"{name}-{width}.png").stat().st_size > 5_000, (name, width)


def test_on_a_phone_the_menu_is_collapsed_and_opens_and_on_a_desktop_it_is_always_shown(site, owner, browser):
    server, _ = site
    log_in(browser, server.url, owner.username)

    viewport(browser, PHONE)
    browser.get(server.url + "/environments/")
    button = browser.find_element(By.ID, "nav-menu-button")
    runs = browser.find_element(By.ID, "site-nav-runs")
    assert button.is_displayed() and not runs.is_displayed() and not browser.find_element(By.ID, "signed-in-as").is_displayed()
    # Collapsed, the header is one row: the brand and the menu button side by side.
    assert browser.execute_script("return document.querySelector('header.site').getBoundingClientRect().height") < 60
    assert browser.execute_script("return document.documentElement.scrollWidth") <= PHONE
    button.click()
    WebDriverWait(browser, 5).until(lambda d: runs.is_displayed())
    assert browser.find_element(By.ID, "nav-evaluations").is_displayed()
    assert browser.find_element(By.ID, "signed-in-as").is_displayed()
    assert browser.execute_script("return document.documentElement.scrollWidth") <= PHONE
    screenshot(browser, PHONE, "menu-open")
    runs.click()  # the opened menu is usable: it takes the member where it says
    WebDriverWait(browser, 15).until(EC.presence_of_element_located((By.ID, "runs")))
    assert "/runs/" in browser.current_url
    assert not browser.find_element(By.ID, "site-nav-runs").is_displayed()  # a new page starts collapsed
    button = browser.find_element(By.ID, "nav-menu-button")
    button.click()
    WebDriverWait(browser, 5).until(lambda d: d.find_element(By.ID, "site-nav-runs").is_displayed())
    button.click()  # and closes again
    WebDriverWait(browser, 5).until(lambda d: not d.find_element(By.ID, "site-nav-runs").is_displayed())

    viewport(browser, DESKTOP)
    browser.get(server.url + "/environments/")
    assert not browser.find_element(By.ID, "nav-menu-button").is_displayed()
    for link in ("nav-environments", "site-nav-runs", "nav-evaluations", "signed-in-as"):
        assert browser.find_element(By.ID, link).is_displayed(), link


def test_a_signed_out_visitor_gets_the_same_fit_and_menu(site, browser):
    server, _ = site
    for width in (PHONE, DESKTOP):
        viewport(browser, width)
        # The last is acme's private environment: a visitor gets the site's 404 page.
        for path in ("/", "/environments/", "/environments/acme/echo/", "/accounts/login/", "/environments/acme/quiz/"):
            browser.get(server.url + path)
            assert browser.execute_script("return document.documentElement.scrollWidth") <= width, (width, path)
        login = browser.find_element(By.ID, "nav-login")
        if width == PHONE:
            assert not login.is_displayed()
            browser.find_element(By.ID, "nav-menu-button").click()
            WebDriverWait(browser, 5).until(lambda d: d.find_element(By.ID, "nav-login").is_displayed())
        assert login.is_displayed()


def test_the_one_time_key_copy_button_copies_it_under_the_csp(site, owner, browser):
    server, _ = site
    log_in(browser, server.url, owner.username)
    # Clipboard writes from a headless page need the permission a user grants by clicking in a real one.
    browser.execute_cdp_cmd("Browser.grantPermissions", {
        "origin": server.url, "permissions": ["clipboardReadWrite", "clipboardSanitizedWrite"]})
    viewport(browser, PHONE)
    browser.get(server.url + "/console/acme/")
    browser.find_element(By.ID, "id_name").send_keys("copied")
    browser.find_element(By.XPATH, "//button[normalize-space()='Create key']").click()
    token = WebDriverWait(browser, 15).until(EC.presence_of_element_located((By.ID, "new-token"))).text
    assert token.startswith("ors_")
    assert browser.execute_script("return document.documentElement.scrollWidth") <= PHONE
    browser.find_element(By.ID, "copy-token").click()
    WebDriverWait(browser, 5).until(lambda d: d.find_element(By.ID, "copy-token").get_attribute("data-copied"))
    assert browser.find_element(By.ID, "copy-token").get_attribute("data-copied") == "Copied"
    pasted = browser.execute_async_script(
        "const done = arguments[0]; navigator.clipboard.readText().then(done, e => done('error: ' + e));")
    assert pasted == token
    violations = [e for e in browser.get_log("browser") if "Content Security Policy" in e.get("message", "")]
    assert not violations, violations
    screenshot(browser, PHONE, "one-time-key")


def test_every_page_names_the_favicon_and_it_is_served(site, browser):
    server, _ = site
    browser.get(server.url + "/environments/")
    href = browser.find_element(By.CSS_SELECTOR, 'link[rel="icon"]').get_attribute("href")
    answer = browser.execute_async_script(
        "const done = arguments[arguments.length - 1]; fetch(arguments[0]).then(r => r.text().then(t => done([r.status, "
        "r.headers.get('content-type'), t.slice(0, 4)])), e => done(['error', String(e)]));", href)
    assert answer[0] == 200 and answer[1].startswith("image/svg+xml") and answer[2] == "<svg", answer
