"""The sandbox worker's cached schema checks (sandbox/openenv_host.py CheckedSchemas) answer
exactly as ``jsonschema.validate`` does, checking each distinct schema against its metaschema once."""

from __future__ import annotations

import jsonschema
import pytest
from referencing import Registry

from orsplatform.sandbox.openenv_host import CheckedSchemas

SCHEMA = {"type": "object", "properties": {"result": {"type": "integer"}}, "required": ["result"]}


class CountingChecks:
    """jsonschema's Draft 2020-12 validator class, counting its metaschema checks."""

    def __init__(self) -> None:
        self.checks = 0
        base = jsonschema.Draft202012Validator
        counter = self

        class Counted(base):
            @classmethod
            def check_schema(cls, schema, *args, **kwargs):
                counter.checks += 1
                return base.check_schema(schema, *args, **kwargs)

        self.cls = Counted


def test_a_valid_result_passes_and_an_invalid_one_raises_as_jsonschema_does():
    validate = CheckedSchemas(jsonschema.validate)
    validate({"result": 3}, SCHEMA, registry=Registry())
    with pytest.raises(jsonschema.ValidationError) as cached:
        validate({"result": "three"}, SCHEMA, registry=Registry())
    with pytest.raises(jsonschema.ValidationError) as original:
        jsonschema.validate({"result": "three"}, SCHEMA, registry=Registry())
    assert cached.value.message == original.value.message


def test_a_schema_is_checked_once_however_many_results_it_validates():
    counting = CountingChecks()
    validate = CheckedSchemas(jsonschema.validate)
    for value in range(20):
        validate({"result": value}, SCHEMA, counting.cls, registry=Registry())
    assert counting.checks == 1


def test_a_schema_changed_in_place_is_checked_and_applied_anew():
    counting = CountingChecks()
    validate = CheckedSchemas(jsonschema.validate)
    schema = {"type": "object", "properties": {"result": {"type": "integer"}}}
    validate({"result": 1}, schema, counting.cls, registry=Registry())
    schema["properties"]["result"]["type"] = "string"
    with pytest.raises(jsonschema.ValidationError):
        validate({"result": 1}, schema, counting.cls, registry=Registry())
    assert counting.checks == 2


def test_a_bad_schema_raises_every_time_and_is_never_kept():
    validate = CheckedSchemas(jsonschema.validate)
    bad = {"type": 12}
    for _ in range(2):
        with pytest.raises(jsonschema.SchemaError):
            validate({}, bad, registry=Registry())
    assert validate.validators == {}


def test_calls_made_otherwise_go_to_jsonschema_unchanged():
    seen = []

    def original(*args, **kwargs):
        seen.append((args, kwargs))

    validate = CheckedSchemas(original)
    validate({"result": 1}, SCHEMA, None, format_checker=None)  # an argument MCP does not pass
    validate({"result": 1}, {"x": {1, 2}})  # not JSON
    assert len(seen) == 2 and validate.validators == {}


def test_install_wraps_jsonschema_once():
    before = jsonschema.validate
    try:
        CheckedSchemas.install()
        CheckedSchemas.install()
        assert isinstance(jsonschema.validate, CheckedSchemas)
        assert jsonschema.validate.original is before
    finally:
        jsonschema.validate = before
