"""The site's own 404 and 500 pages (Django's bare ones otherwise): in the site's style, with a way
back, and saying nothing about what was not found or what broke."""

from __future__ import annotations

from django.test import Client
from django.urls import path

from tests.hub.conftest import login


def test_an_unknown_page_is_the_sites_404_page_with_a_way_back(live_db):
    response = Client().get("/environments/nobody/nothing/")
    html = response.content.decode()
    assert response.status_code == 404 and 'id="not-found"' in html and "Page not found" in html
    assert "hub/site.css" in html and 'rel="icon"' in html and 'href="/environments/"' in html
    assert 'id="nav-login"' in html  # the site's header, so a visitor can sign in from here


def test_a_private_environment_is_the_same_404_for_an_outsider_and_a_visitor(hub, outsider):
    for client in (Client(), login(outsider)):
        response = client.get("/environments/acme/quiz/")
        assert response.status_code == 404 and 'id="not-found"' in response.content.decode()
        assert "quiz" not in response.content.decode().split('id="not-found"')[1].split("<code>")[0]


def test_the_owner_and_a_member_see_the_environment_not_the_404(hub, owner, member):
    for person in (owner, member):
        response = login(person).get("/environments/acme/quiz/")
        assert response.status_code == 200 and 'id="not-found"' not in response.content.decode()


def test_the_404_page_escapes_the_path_it_shows(live_db):
    html = Client().get("/environments/<script>alert(1)</script>/x/").content.decode()
    assert "<script>alert(1)</script>" not in html and "Page not found" in html


def boom(request):
    raise RuntimeError("database password is hunter2")


urlpatterns = [path("boom/", boom)]


def test_a_server_error_is_the_sites_500_page_and_shows_none_of_the_error(live_db, settings):
    settings.ROOT_URLCONF = __name__
    client = Client(raise_request_exception=False)
    response = client.get("/boom/")
    html = response.content.decode()
    assert response.status_code == 500 and 'id="server-error"' in html and "hub/site.css" in html
    assert "hunter2" not in html and "RuntimeError" not in html
