#!/usr/bin/env python3
"""Where a test run's time went, from pytest's JUnit XML (``--junitxml``): per file and per folder.

    python -m pytest --junitxml=var/junit.xml ...; python tools/test_timings.py var/junit.xml [--top 20]
    python tools/test_timings.py before.xml after.xml      # the two side by side, per file

A test's time is its set-up, call and tear-down together. Under xdist the sum over a file is the work
its tests did (one worker's time each), not the run's wall time, which pytest prints at the end.
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict


def per_file(path: str) -> tuple[dict[str, float], dict[str, int], dict[str, int], dict[str, float]]:
    """File -> seconds, tests, failures+errors, CPU seconds (tests/fixtures/cpu.py's property)."""
    cpu: dict[str, float] = defaultdict(float)
    seconds: dict[str, float] = defaultdict(float)
    tests: dict[str, int] = defaultdict(int)
    failed: dict[str, int] = defaultdict(int)
    for case in ET.parse(path).getroot().iter("testcase"):
        name = case.get("classname", "").split("::")[0]
        if not name:  # a test interrupted before it was reported
            continue
        # classname is dotted (tests.ors.test_calls[.Class]): the file is up to the test_ module.
        parts = name.split(".")
        cut = next((i for i, part in enumerate(parts) if part.startswith("test_")), len(parts) - 1)
        file = "/".join(parts[: cut + 1]) + ".py"
        seconds[file] += float(case.get("time", 0))
        for prop in case.iter("property"):
            if prop.get("name") == "cpu_seconds":
                cpu[file] += float(prop.get("value", 0))
        tests[file] += 1
        if case.find("failure") is not None or case.find("error") is not None:
            failed[file] += 1
    return seconds, tests, failed, cpu


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("xml", nargs="+")
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args(argv)
    runs = [per_file(path) for path in args.xml]
    seconds, tests, failed, cpu = runs[-1]
    print(f"{sum(tests.values())} tests in {len(tests)} files, {sum(seconds.values()):.0f} s of test time, "
          f"{sum(cpu.values()):.0f} s of CPU, {sum(failed.values())} failed")
    folders: dict[str, float] = defaultdict(float)
    for file, s in seconds.items():
        folders[file.rsplit("/", 1)[0]] += s
    print("\n| Folder | Test time (s) |\n|---|---:|")
    for folder, s in sorted(folders.items(), key=lambda kv: -kv[1]):
        print(f"| `{folder}/` | {s:.0f} |")
    if len(runs) == 1:
        print(f"\n| File (the {args.top} slowest) | Tests | Test time (s) | CPU (s) |\n|---|---:|---:|---:|")
        for file, s in sorted(seconds.items(), key=lambda kv: -kv[1])[: args.top]:
            print(f"| `{file}` | {tests[file]} | {s:.0f} | {cpu.get(file, 0):.0f} |")
        print(f"\n| File (the {args.top} costliest in CPU) | Tests | CPU (s) |\n|---|---:|---:|")
        for file, s in sorted(cpu.items(), key=lambda kv: -kv[1])[: args.top]:
            print(f"| `{file}` | {tests[file]} | {s:.0f} |")
        return 0
    before = runs[0][0]
    print(f"\n| File (the {args.top} slowest before) | Before (s) | After (s) |\n|---|---:|---:|")
    for file, s in sorted(before.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"| `{file}` | {s:.0f} | {seconds.get(file, 0):.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
