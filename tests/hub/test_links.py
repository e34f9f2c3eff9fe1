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


def _unlabelled(html: str) -> list[str]:
    from html.parser import HTMLParser

    fields: list[dict] = []
    labels: set[str] = set()

    class Collect(HTMLParser):
        def handle_starttag(self, tag, attrs):
            a = dict(attrs)
            if tag == "label" and a.get("for"):
                labels.add(a["for"])
            elif tag in ("input", "select", "textarea") and a.get("type") not in ("hidden", "submit", "button"):
                fields.append(a)

    Collect().feed(html)
    return [f.get("name", "?") for f in fields if f.get("id") not in labels and not f.get("aria-label")]


def test_every_form_field_has_a_label(hub, owner):
    client = login(owner)
    urls = ["/environments/", "/environments/acme/quiz/tasks/", "/environments/acme/quiz/versions/",
            "/environments/acme/quiz/diff/?a=1&b=2", "/console/acme/", "/console/acme/environments/",
            "/analytics/acme/", "/analytics/acme/sessions/", "/analytics/acme/environments/acme/quiz/"]
    for url in urls:
        assert _unlabelled(client.get(url).content.decode()) == [], url
    assert _unlabelled(Client().get("/accounts/login/").content.decode()) == []
