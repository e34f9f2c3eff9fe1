"""What a sandbox worker answers when something fails: the errors its protocol loop
(worker.py) turns into a reply's ``kind``, and a tool's refusal of its input in words a trainer reads.

Imported by the worker inside its sandbox (bound there by binding.py): standard library only.
"""

from __future__ import annotations


class EnvironmentExit(Exception):
    """Environment code called sys.exit(); reported like any exception of the environment."""


class UnknownSession(Exception):
    pass


def tool_error(message: str, reason: str) -> dict:
    return {"ok": False, "error": message, "reason": reason}


def readable_validation(tool: str, errors: list[dict]) -> str:
    """pydantic's errors as one line a trainer can read in a log: ``Invalid arguments for tool
    'submit': answer: Field required; n: Input should be a valid integer (got 'many').``"""
    parts = []
    for error in errors[:10]:
        where = ".".join(str(p) for p in error.get("loc", ())) or "arguments"
        part = f"{where}: {error.get('msg', 'invalid')}"
        if error.get("type") != "missing" and "input" in error:
            shown = repr(error["input"])
            part += f" (got {shown[:60] + '...' if len(shown) > 60 else shown})"
        parts.append(part)
    more = f"; and {len(errors) - 10} more" if len(errors) > 10 else ""
    return f"Invalid arguments for tool {tool!r}: {'; '.join(parts)}{more}."


class SetupError(Exception):
    pass
