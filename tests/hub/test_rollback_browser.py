"""Rolling back in a real browser (headless Chromium against a daphne server on the test database):
"Serve @1" asks first, Cancel changes nothing, confirming serves @1, and the page it came back to
offers "Undo: serve @2 again", which works. Screenshots land in test-artifacts/hub/."""

from __future__ import annotations

import re

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

from orsplatform.catalog.models import Environment
from tests.analytics.test_browser import _chromium_installed  # noqa: F401 (an autouse fixture)
from tests.hub.test_browser import printed, screenshot, wait_for  # noqa: F401 (printed: a fixture)

pytestmark = pytest.mark.e2e


def current(hub) -> int:
    return Environment.objects.select_related("current_version").get(id=hub.private.id).current_version.number


def test_a_member_rolls_back_through_a_confirmation_and_undoes_it(printed, browser, hub):  # noqa: F811
    server, output = printed
    browser.get(re.search(r"one-time link: (\S+)", output).group(1))
    wait_for(browser, By.ID, "signed-in-as")
    browser.get(server.url + "/environments/acme/quiz/versions/")
    wait_for(browser, By.ID, "versions")

    def serve_one() -> None:
        button = [b for b in browser.find_elements(By.CSS_SELECTOR, "#versions button") if b.text == "Serve @1"]
        button[0].click()
        wait_for(browser, By.ID, "rollback-confirm")

    serve_one()
    assert "It serves @2 now" in browser.find_element(By.ID, "rollback-confirm").text
    screenshot(browser, "20-rollback-confirm")
    browser.find_element(By.ID, "rollback-cancel").click()
    wait_for(browser, By.ID, "versions")
    assert current(hub) == 2 and not browser.find_elements(By.ID, "rollback-undo")

    serve_one()
    browser.find_element(By.ID, "rollback-confirm-button").click()
    undo = wait_for(browser, By.ID, "rollback-undo-button")
    assert undo.text == "Undo: serve @2 again" and current(hub) == 1
    assert "now serves version 1" in browser.find_element(By.CSS_SELECTOR, "ul.messages").text
    screenshot(browser, "21-rollback-undo")

    undo.click()
    WebDriverWait(browser, 15).until(EC.text_to_be_present_in_element((By.ID, "rollback-undo-button"),
                                                                      "Undo: serve @1 again"))
    assert current(hub) == 2
