"""A package whose publish queues a build (it has requirements), for the REST API's tests of
environments whose first version is building or failed."""

from __future__ import annotations

import textwrap

from tests.catalog.support import zip_bytes

NEEDY_ENV = textwrap.dedent('''
    from ors import Environment, Split, TextBlock, ToolOutput, tool


    class Needy(Environment):
        @classmethod
        def list_splits(cls):
            return [Split(name="train", type="train")]

        @classmethod
        def list_tasks(cls, split):
            return [{"n": 1}]

        def get_prompt(self):
            return [TextBlock(text="n")]

        @tool
        def done(self) -> ToolOutput:
            """Finish."""
            return ToolOutput(blocks=[TextBlock(text="bye")], reward=1.0, finished=True)
''')


def needy_package(requirement: str = "easydict==1.13", flavour: str = "") -> bytes:
    """`flavour` makes otherwise identical packages differ (identical content is a no-op publish)."""
    return zip_bytes({"env.py": NEEDY_ENV + f"\nFLAVOUR = {flavour!r}\n", "requirements.txt": requirement + "\n"})
