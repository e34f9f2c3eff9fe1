"""The house stays easy to carry: its limits and its room map are checked from the code (fast tier)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import house  # noqa: E402
import room_map  # noqa: E402


def test_no_module_or_function_is_over_its_limit_without_an_allowance():
    over = [str(b) for b in house.breaches(house.python_files()) if b.key not in house.ALLOWED]
    assert not over, ("split these by what they hold (docs/architecture.md; python tools/house.py):\n"
                      + "\n".join(over))


def test_the_platform_has_no_import_circle():
    assert house.import_circles(house.import_graph(ROOT / "orsplatform")) == []


def test_the_checker_finds_a_long_function_a_long_module_and_a_circle(tmp_path):
    # The checks above pass on today's tree; this one shows they would fail on a bad one.
    body = "\n".join(f"    x{i} = {i}" for i in range(house.FUNCTION_LINES))
    (tmp_path / "long.py").write_text(f"def long():\n{body}\n" + "\n" * house.MODULE_LINES)
    found = {b.key for b in house.breaches([tmp_path / "long.py"], root=tmp_path)}
    assert found == {"long.py", "long.py::long"}

    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg import b\n")
    (package / "b.py").write_text("def late():\n    from pkg.a import x\n")
    (package / "c.py").write_text("from . import a\n")
    assert house.import_circles(house.import_graph(package)) == [["pkg.a", "pkg.b"]]


def test_the_room_map_in_docs_architecture_is_drawn_from_todays_code():
    document = room_map.DOC.read_text(encoding="utf-8")
    assert room_map.with_map(document, room_map.render()) == document, (
        "docs/architecture.md's room map is stale: python tools/room_map.py --write")


def test_the_room_map_names_every_module_and_the_imports_between_rooms():
    drawn = room_map.render()
    for path in (ROOT / "orsplatform" / "engine").glob("*.py"):
        if path.read_text().strip():
            assert f"| `{path.name}` |" in drawn
    engine = drawn.split("### `orsplatform/engine/`")[1].split("###")[0]
    assert "`executors`" in engine.split(";")[0]  # the engine imports the executors
