"""The publish-time inspector runs in the workers' sandbox: a package whose import snoops for the
platform's secrets finds none (what it found is published in a tool's description, where the test
reads it back), and what it writes outside its tmp goes nowhere."""

from __future__ import annotations

import json
import os
import textwrap

from django.conf import settings

from orsplatform.catalog.services import environment_publish

SNOOP_ENV = textwrap.dedent(r'''
    import glob
    import json
    import os
    import socket
    import sys

    from ors import Environment, Split, TextBlock, ToolOutput, tool


    def attempt(fn):
        try:
            return {"ok": True, "value": fn()}
        except BaseException as exc:
            return {"ok": False, "error": type(exc).__name__}


    def read(path):
        with open(path, "rb") as fh:
            return fh.read(100000).decode("latin-1")


    def connect(port):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


    FOUND = {
        "environ": dict(os.environ),
        "procs": {d: attempt(lambda: read(d + "/environ")) for d in glob.glob("/proc/[0-9]*")},
        "gateway": attempt(lambda: read("/proc/%d/environ" % GATEWAY_PID)),
        "sys_path": sys.path,
        "db": attempt(lambda: read(DB_PATH)),
        "settings": attempt(lambda: read(SETTINGS_PATH)),
        "redis": attempt(lambda: connect(6379)),
        "write": attempt(lambda: open(WRITE_PATH, "w").write("owned")),
    }


    class Snoop(Environment):
        @classmethod
        def list_splits(cls):
            return [Split(name="train", type="train")]

        @classmethod
        def list_tasks(cls, split):
            return [{"id": 0}]

        def get_prompt(self):
            return [TextBlock(text="hi")]

        @tool
        def look(self) -> ToolOutput:
            """placeholder"""
            return ToolOutput(blocks=[TextBlock(text="x")], reward=0.0)

        look.__doc__ = json.dumps(FOUND)
''')


def test_the_inspector_finds_none_of_the_platforms_secrets(owner, tmp_path):
    db_path = str(settings.DATABASES["default"]["NAME"])
    write_path = tmp_path / "written-by-tenant"
    source = (SNOOP_ENV.replace("GATEWAY_PID", str(os.getpid())).replace("DB_PATH", repr(db_path))
              .replace("SETTINGS_PATH", repr(str(settings.BASE_DIR / "orsplatform" / "settings.py")))
              .replace("WRITE_PATH", repr(str(write_path))))
    package = tmp_path / "snoop"
    package.mkdir()
    (package / "env.py").write_text(source)
    version = environment_publish(team=owner.team, source_dir=package).version
    found = json.loads(version.tools[0]["description"])

    assert set(found["environ"]) <= {"PATH", "HOME", "LANG", "TMPDIR", "MALLOC_ARENA_MAX", "PWD",
                                     "ORS_INSPECT_MEMORY_BYTES", "ORS_INSPECT_FILE_BYTES"}
    assert len(found["procs"]) <= 3  # its own pid namespace
    assert found["gateway"]["ok"] is False or settings.SECRET_KEY not in found["gateway"]["value"]
    assert settings.SECRET_KEY not in json.dumps(found)
    assert str(settings.BASE_DIR) not in found["sys_path"]  # no PYTHONPATH to the platform
    for key in ("db", "settings", "redis", "write"):
        assert found[key]["ok"] is False, (key, found[key])
    assert not write_path.exists()
