"""The REST API's JSON parser: DRF's, over the platform's one bounded decoder
(orsplatform/bounded_json.py), so a body nested too deeply or carrying NaN or Infinity is a 400
whose detail says so, never a RecursionError's 500."""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser, get_encoding

from orsplatform import bounded_json


class BoundedJSONParser(JSONParser):
    def parse(self, stream, media_type=None, parser_context=None) -> Any:
        encoding = get_encoding(parser_context or {})
        raw = stream.read()
        try:
            text = raw if encoding.lower().replace("-", "").replace("_", "") == "utf8" else raw.decode(encoding)
            return bounded_json.loads(text)
        except UnicodeDecodeError as exc:
            raise ParseError(f"The body is not valid {encoding}: {exc}") from None
        except bounded_json.JsonRefused as exc:
            raise ParseError(str(exc)) from None
