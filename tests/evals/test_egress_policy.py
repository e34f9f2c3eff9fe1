"""Where the platform may connect on an agent's behalf: every refused address range and form, and
allow-list entries with and without ports (an entry naming a machine does not open its every port)."""

from __future__ import annotations

import ipaddress
import socket
import threading

import httpx
import pytest

from orsplatform.evals import aap, egress
from tests.evals.conftest import api

REFUSED_WITHOUT_ALLOW_LIST = {
    "loopback": ["127.0.0.1", "127.9.9.9", "::1"],
    "private": ["10.1.2.3", "172.16.0.1", "192.168.1.1", "fc00::1", "fd12:3456::1"],
    "link-local": ["169.254.169.254", "fe80::1"],
    "shared (CGNAT)": ["100.64.0.1"],
    "reserved": ["240.0.0.1", "255.255.255.255", "192.0.0.8", "100::1"],
    "multicast": ["224.0.0.1", "239.1.2.3", "ff02::1", "ff0e::1"],
    "unspecified": ["0.0.0.0", "::"],
    "documentation": ["192.0.2.1", "198.51.100.7", "203.0.113.9", "2001:db8::1"],
    "site-local": ["fec0::1"],
}

# IPv6 forms that lead to an IPv4 address through a translator or a tunnel: refused whatever the
# address they embed (a public one too), and the refusal names it.
EMBEDDED = [
    ("::ffff:127.0.0.1", "an IPv4-mapped address (of 127.0.0.1)"),
    ("::ffff:8.8.8.8", "an IPv4-mapped address (of 8.8.8.8)"),
    ("::127.0.0.1", "an IPv4-compatible address (of 127.0.0.1)"),
    ("::8.8.8.8", "an IPv4-compatible address (of 8.8.8.8)"),
    ("::ffff:0:10.0.0.1", "an IPv4-translated address (of 10.0.0.1)"),
    ("64:ff9b::127.0.0.1", "a NAT64 address (of 127.0.0.1)"),
    ("64:ff9b::8.8.8.8", "a NAT64 address (of 8.8.8.8)"),
    ("64:ff9b:1::a00:1", "a local-use NAT64 address"),
    ("2002:7f00:1::1", "a 6to4 address (of 127.0.0.1)"),
    ("2002:808:808::1", "a 6to4 address (of 8.8.8.8)"),
    ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "a Teredo address (of 192.0.2.45, via 65.54.227.120)"),
    ("2001:0:4136:e378:8000:63bf:80ff:fffe", "a Teredo address (of 127.0.0.1, via 65.54.227.120)"),
]


@pytest.fixture
def resolver(monkeypatch):
    """The resolver input the policy is judged on: name -> the addresses it answers."""
    answers: dict[str, list[str]] = {}
    monkeypatch.setattr(egress, "resolve", lambda host, port: answers.get(host, []))
    return answers


def _refusal(host: str, port: int = 443, allowed: list[str] | None = None) -> str:
    try:
        egress.admit(host, port, allowed or [])
    except egress.EgressRefused as exc:
        return str(exc)
    return ""


@pytest.mark.parametrize(("kind", "address"), [(k, a) for k, v in REFUSED_WITHOUT_ALLOW_LIST.items() for a in v])
def test_every_non_public_address_is_refused_without_an_allow_list(kind, address):
    assert "non-public address" in _refusal(address), (kind, address)


@pytest.mark.parametrize(("address", "form"), EMBEDDED)
def test_ipv6_forms_that_embed_an_ipv4_address_are_refused_and_named(address, form):
    shown = ipaddress.ip_address(address)  # as the platform spells it (64:ff9b::7f00:1)
    assert _refusal(address) == f"The agent's address [{shown}]:443 is {form}; such addresses are refused."


@pytest.mark.parametrize(("address", "form"), EMBEDDED)
def test_embedded_forms_are_refused_even_when_the_allow_list_covers_them(address, form):
    assert form in _refusal(address, 443, ["[::/0]:443", "0.0.0.0/0:443"])


@pytest.mark.parametrize("address", ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111"])
def test_public_addresses_are_admitted_on_any_port_without_an_allow_list(address):
    assert _refusal(address, 443) == "" and _refusal(address, 8443) == ""


def test_a_name_is_judged_by_every_address_it_resolves_to(resolver):
    resolver["public.test"] = ["8.8.8.8"]
    resolver["split.test"] = ["8.8.8.8", "10.0.0.7"]
    resolver["nat64.test"] = ["64:ff9b::a9fe:a9fe"]  # 169.254.169.254 through NAT64
    resolver["nowhere.test"] = []
    assert _refusal("public.test") == ""
    assert _refusal("split.test") == ("The agent's host split.test:443 (10.0.0.7) has a non-public address; the "
                                      "operator may allow it with ORS_EVAL_AGENT_ALLOWED_HOSTS.")
    assert "a NAT64 address (of 169.254.169.254)" in _refusal("nat64.test")
    assert _refusal("nowhere.test") == "The agent's host 'nowhere.test' does not resolve."


def test_an_ip_entry_with_a_port_admits_that_port_only():
    allowed = ["127.0.0.1:8765"]
    assert _refusal("127.0.0.1", 8765, allowed) == ""
    assert _refusal("127.0.0.1", 6379, allowed) == "The agent's address 127.0.0.1:6379 is not in ORS_EVAL_AGENT_ALLOWED_HOSTS."
    assert "not in ORS_EVAL_AGENT_ALLOWED_HOSTS" in _refusal("127.0.0.2", 8765, allowed)


def test_an_entry_without_a_port_admits_only_ports_80_and_443():
    for allowed in (["127.0.0.1"], ["127.0.0.0/8"], ["[::1]"], ["::1"]):
        host = "::1" if "::1" in allowed[0] else "127.0.0.1"
        assert _refusal(host, 80, allowed) == "" and _refusal(host, 443, allowed) == "", allowed
        assert "not in ORS_EVAL_AGENT_ALLOWED_HOSTS" in _refusal(host, 6379, allowed), allowed
        assert "not in ORS_EVAL_AGENT_ALLOWED_HOSTS" in _refusal(host, 8765, allowed), allowed


def test_cidr_and_bracketed_ipv6_entries_take_a_port():
    assert _refusal("10.2.3.4", 9000, ["10.0.0.0/8:9000"]) == ""
    assert "not in" in _refusal("10.2.3.4", 9001, ["10.0.0.0/8:9000"])
    assert _refusal("::1", 8080, ["[::1]:8080"]) == ""
    assert _refusal("fd00::5", 8080, ["[fd00::/8]:8080"]) == ""
    assert "not in" in _refusal("::1", 8081, ["[::1]:8080"])


def test_a_hostname_entry_admits_that_name_on_its_ports_wherever_it_resolves(resolver):
    resolver["agents.internal"] = ["10.0.0.5"]
    resolver["other.internal"] = ["10.0.0.5"]
    allowed = ["Agents.Internal:8443"]
    assert _refusal("agents.internal", 8443, allowed) == ""
    assert "not in" in _refusal("agents.internal", 6379, allowed)
    assert "not in" in _refusal("other.internal", 8443, allowed)  # the same address under another name


def test_an_allow_list_admits_nothing_else_and_a_broken_entry_fails_closed(resolver):
    resolver["public.test"] = ["8.8.8.8"]
    assert "not in" in _refusal("public.test", 443, ["10.0.0.0/8"])
    # A typo must not empty the list (which would mean "any public host"): it admits nothing.
    for broken in (["127.0.0.1:http"], ["127.0.0.1:70000"], ["[::1"], ["bad host!"]):
        assert "not in" in _refusal("8.8.8.8", 443, broken), broken
        assert "not in" in _refusal("127.0.0.1", 443, broken), broken


def test_a_url_with_a_bad_port_or_scheme_is_refused():
    with pytest.raises(aap.UrlNotAllowed, match="port that is not a number"):
        aap.check_url("http://127.0.0.1:99999/")
    with pytest.raises(aap.UrlNotAllowed, match="http:// or https://"):
        aap.check_url("file:///etc/passwd")


class Listener:
    """A real TCP listener on loopback that counts the connections it is offered."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def listener():
    it = Listener()
    yield it
    it.close()


def test_registering_a_redis_port_of_an_allowed_ip_is_refused(owner, agents, settings, listener):
    # The allow-list admits the agent's port on loopback, not every port of loopback.
    assert settings.ORS_EVAL_AGENT_ALLOWED_HOSTS == [agents.url.removeprefix("http://")]
    for url in ("http://127.0.0.1:6379", f"http://127.0.0.1:{listener.port}", "http://[::ffff:127.0.0.1]:6379"):
        r = api(owner).post("/api/v1/agents", {"name": "r", "agent": "solver", "url": url}, format="json")
        assert r.status_code == 400, (url, r.content)
        assert r.json()["detail"].endswith("such addresses are refused.") or "not in ORS_EVAL_AGENT_ALLOWED_HOSTS" in \
            r.json()["detail"], r.json()
    assert listener.accepted == 0


def test_the_transport_itself_never_opens_a_refused_connection(settings, listener):
    # Without check_url in front: the connection is judged where it is opened.
    settings.ORS_EVAL_AGENT_ALLOWED_HOSTS = ["127.0.0.1:1"]
    with httpx.Client(transport=egress.transport(), trust_env=False) as client:
        for url in (f"http://127.0.0.1:{listener.port}/meta", f"http://[::ffff:127.0.0.1]:{listener.port}/meta",
                    "http://127.0.0.1:6379/"):
            with pytest.raises(egress.EgressRefused):
                client.get(url)
    assert listener.accepted == 0


@pytest.mark.parametrize("url", ["http://[::1", "http://" + "a" * 100 + ".com/", "http://a..b/", "http://127.0.0.1:0/",
                                 "http://127.0.0.1:99999/", "http://0x7f000001/", "http://2130706433/", "http://127.1/"])
def test_malformed_or_disguised_agent_urls_are_a_400_never_a_500(owner, agents, url):
    r = api(owner).post("/api/v1/agents", {"name": "m", "agent": "solver", "url": url}, format="json")
    assert r.status_code == 400 and r.json()["detail"], (url, r.content)
