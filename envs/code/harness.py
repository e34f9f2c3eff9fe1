"""Test harness the code environment runs in a fresh interpreter, one run per tool call.

It is started as `python -I harness.py` inside a temporary directory holding
solution.py and tests.json. It loads the solution, runs every test statement
separately against it and writes a JSON summary to the path given on the first
line of stdin, so nothing the solution prints can be mistaken for the result.
The resource limits bound accidental damage; this is not a security sandbox.
"""

import json
import os
import resource
import signal
import sys
import traceback

MAX_FILE_BYTES = 16 * 1024 * 1024
MAX_ADDRESS_SPACE_BYTES = 2 * 1024 * 1024 * 1024
MAX_ERROR_CHARS = 2000


def _cap(limit: int, value: int) -> None:
    _, hard = resource.getrlimit(limit)
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    resource.setrlimit(limit, (value, value))


def _describe(exc: BaseException) -> str:
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()[:MAX_ERROR_CHARS]


def main() -> None:
    result_path = sys.stdin.readline().strip()
    with open("tests.json", encoding="utf-8") as f:
        tests: list[str] = json.load(f)
    with open("solution.py", encoding="utf-8") as f:
        source = f.read()

    # Oversized writes (stdout and stderr are files) then fail with OSError instead of killing the run.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    _cap(resource.RLIMIT_FSIZE, MAX_FILE_BYTES)
    _cap(resource.RLIMIT_AS, MAX_ADDRESS_SPACE_BYTES)

    # Not "__main__", so a solution's `if __name__ == "__main__":` demo block does not run.
    namespace: dict[str, object] = {"__name__": "solution"}
    load_error: str | None = None
    try:
        exec(compile(source, "solution.py", "exec"), namespace)
    except BaseException as exc:  # SystemExit and friends raised by the solution are failures too
        # Drop the harness's own frame so the traceback starts in solution.py.
        frames = exc.__traceback__.tb_next if exc.__traceback__ else None
        load_error = "".join(traceback.format_exception(type(exc), exc, frames))[-MAX_ERROR_CHARS:]

    results: list[dict[str, object]] = []
    for test in tests:
        if load_error is not None:
            results.append({"test": test, "passed": False, "error": "the solution failed to load"})
            continue
        try:
            exec(compile(test, "<test>", "exec"), dict(namespace))
        except BaseException as exc:
            results.append({"test": test, "passed": False, "error": _describe(exc)})
        else:
            results.append({"test": test, "passed": True, "error": None})

    with open(result_path, "w", encoding="utf-8") as f:
        json.dump({"load_error": load_error, "results": results}, f)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    # Skip interpreter shutdown: threads or atexit hooks left by the solution must not hang the run.
    os._exit(0)


if __name__ == "__main__":
    main()
