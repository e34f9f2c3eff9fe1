"""The ORS face's field parsing (orsplatform/ors/wire.py) on its own: every malformed value is a 400
that says which field and what it must be, and a secret's value never appears in a message. No
server, no database: the fast tier."""

from __future__ import annotations

import base64
import json

import pytest

from orsplatform.ors import wire
from orsplatform.ors.http import HttpError, Request


def request(**headers: str) -> Request:
    raw = {name.replace("_", "-").lower().encode(): value.encode("latin-1") for name, value in headers.items()}
    return Request(scope={}, receive=None, send=None, method="POST", path="/", headers=raw)


def refused(call, *args) -> str:
    with pytest.raises(HttpError) as caught:
        call(*args)
    assert caught.value.status == 400
    return caught.value.detail


@pytest.mark.parametrize("sid", ["a", "A-b_c.d:e", "x" * 128, " padded "])
def test_a_session_id_of_letters_digits_and_dot_underscore_colon_dash_is_read(sid):
    assert wire.require_sid(request(x_session_id=sid)) == sid.strip()


@pytest.mark.parametrize("sid", [None, "", "   ", "x" * 129, "a/b", "a b", "ü"])
def test_a_missing_or_malformed_session_id_is_refused_naming_the_header(sid):
    req = request() if sid is None else request(x_session_id=sid)
    assert "X-Session-ID" in refused(wire.require_sid, req)


def test_strings_and_integers_are_read_and_their_type_checked_by_name():
    body = {"s": "text", "i": 3, "b": True, "f": 1.5, "n": None}
    assert wire.require_str(body, "s") == "text" and wire.optional_str(body, "n") is None
    assert wire.require_int(body, "i") == 3 and wire.optional_int(body, "missing") is None
    assert refused(wire.require_str, body, "missing") == "'missing' is required"
    assert refused(wire.require_str, body, "i") == "'i' must be a string"
    assert refused(wire.require_int, body, "missing") == "'missing' is required"
    # JSON's true is not an integer, though Python's bool is one.
    assert refused(wire.require_int, body, "b") == "'b' must be an integer"
    assert refused(wire.optional_int, body, "f") == "'f' must be an integer"


def x_secrets(data) -> str:
    return base64.b64encode(json.dumps(data).encode()).decode()


def test_secrets_come_from_the_header_and_the_body_as_strings_or_value_objects():
    header = x_secrets({"A": "one", "B": {"value": "two", "allowed_domains": ["x.test"]}})
    assert wire.secrets_from_header(request(x_secrets=header)) == {"A": "one", "B": "two"}
    assert wire.secrets_from_header(request()) == {} and wire.secrets_from_header(request(x_secrets=" ")) == {}
    assert wire.secrets_from_body({"secrets": {"C": "three"}}) == {"C": "three"}
    assert wire.secrets_from_body({}) == {}


@pytest.mark.parametrize("header", [
    "not base64!", base64.b64encode(b"not json").decode(), x_secrets(["a", "list"]),
    base64.b64encode(b"[" * 1000 + b"]" * 1000).decode(),
])
def test_a_malformed_secrets_header_is_refused(header):
    assert refused(wire.secrets_from_header, request(x_secrets=header)).startswith("X-Secrets must be")


def test_a_refused_secret_entry_names_the_entry_never_its_value():
    canary = "canary-value-9f1c"
    detail = refused(wire.secrets_from_body, {"secrets": {"KEY": {"value": 7, "note": canary}}})
    assert "'KEY'" in detail and canary not in detail
    detail = refused(wire.secrets_from_header, request(x_secrets=x_secrets({"KEY": [canary]})))
    assert "'KEY'" in detail and canary not in detail


def test_per_session_environment_variables_are_refused_unless_empty():
    wire.refuse_env_vars({})
    wire.refuse_env_vars({"env": {}})
    assert "not supported" in refused(wire.refuse_env_vars, {"env": {"A": "1"}})
    assert refused(wire.refuse_env_vars, {"env": {"A": 1}}) == "'env' must be an object of string values"
    assert refused(wire.refuse_env_vars, {"env": "A=1"}) == "'env' must be an object of string values"
