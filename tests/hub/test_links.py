"""Every environment name in the web pages links to its environment page, and every page uses the one
site template and stylesheet."""

from __future__ import annotations

from django.test import Client

from tests.hub.conftest import login

QUIZ = 'href="/environments/acme/quiz/"'


def test_every_page_that_names_an_environment_links_to_its_page(hub, owner):
    client = login(owner)
    pages = {
        "/": QUIZ,
        "/environments/": QUIZ,
        "/console/acme/environments/": QUIZ,
        "/analytics/acme/?range=all": QUIZ,
        "/analytics/acme/environments/acme/quiz/?range=all": QUIZ,
        "/analytics/acme/sessions/?range=all": QUIZ,
        "/analytics/acme/sessions/quiz-0/": QUIZ,
    }
    for url, link in pages.items():
        response = client.get(url)
        assert response.status_code == 200, url
        assert link in response.content.decode(), url


def test_every_page_uses_the_site_template_and_its_one_stylesheet(hub, owner):
    client = login(owner)
    urls = ["/", "/environments/", "/environments/acme/quiz/", "/environments/acme/quiz/tasks/",
            "/environments/acme/quiz/tasks/train/0/", "/environments/acme/quiz/versions/",
            "/environments/acme/quiz/diff/?a=1&b=2", "/console/acme/", "/console/acme/environments/",
            "/analytics/acme/", "/analytics/acme/sessions/", "/analytics/acme/environments/acme/quiz/"]
    for url in urls:
        page = client.get(url).content.decode()
        assert page.count('rel="stylesheet"') == 1 and "/static/hub/site.css" in page, url
        assert "<style" not in page and 'header class="site"' in page, url
    login_page = Client().get("/accounts/login/").content.decode()
    assert "/static/hub/site.css" in login_page and 'for="id_password"' in login_page
