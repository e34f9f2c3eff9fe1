"""Environments written against OpenEnv's own SDK, laid out the way OpenEnv's examples are (a package
with ``models.py``, ``client.py``, ``server/<name>_environment.py``, ``server/app.py`` calling
``create_app``, ``openenv.yaml`` and a ``pyproject.toml`` whose dependencies name ``openenv-core``),
so that each could run on OpenEnv's own server unchanged: ``uvicorn server.app:app``.

- ``tally``: an ``MCPEnvironment`` whose FastMCP tools add to a running total; reaching the reset's
  ``target`` ends the episode with reward 1.
- ``walk``: a plain ``Environment`` on a number line, with its own action, observation and state
  models; reaching ``target`` ends the episode with reward 1.
- ``snoop``: an ``MCPEnvironment`` whose tool tries what hostile code would (host files, the
  network, its neighbours) and reports what it reached.
"""

from __future__ import annotations

import textwrap

# As OpenEnv's example environments declare theirs (the old distribution name included).
PYPROJECT = textwrap.dedent('''
    [build-system]
    requires = ["setuptools>=45", "wheel"]
    build-backend = "setuptools.build_meta"

    [project]
    name = "openenv-NAME-env"
    version = "0.1.0"
    description = "NAME environment for OpenEnv"
    requires-python = ">=3.10"
    dependencies = [
        "openenv-core[core]>=0.2.2",
        "fastapi>=0.115.0",
        "pydantic>=2.0.0",
        "uvicorn>=0.24.0",
        "requests>=2.31.0",
    ]

    [tool.setuptools]
    packages = ["NAME_env", "NAME_env.server"]
    package-dir = { "NAME_env" = ".", "NAME_env.server" = "server" }
''')

OPENENV_YAML = "spec_version: 1\nname: NAME_env\ntype: space\nruntime: fastapi\napp: server.app:app\nport: 8000\n"

TALLY_ENVIRONMENT = textwrap.dedent('''
    """Tally: add numbers until the total is the target."""

    from typing import Any, Optional
    from uuid import uuid4

    from fastmcp import FastMCP
    from openenv.core.env_server.mcp_environment import MCPEnvironment
    from openenv.core.env_server.mcp_types import CallToolAction
    from openenv.core.env_server.types import Action, Observation, State


    class TallyEnvironment(MCPEnvironment):
        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self):
            mcp = FastMCP("tally_env")
            self.total = 0
            self.target = 10

            @mcp.tool
            def add(amount: int) -> int:
                """Add an amount to the total; returns the new total."""
                self.total += amount
                return self.total

            @mcp.tool
            def peek() -> dict:
                """The total and the target."""
                return {"total": self.total, "target": self.target}

            @mcp.tool
            def fail(message: str) -> str:
                """Always fails with the message."""
                raise ValueError(message)

            super().__init__(mcp)
            self._state = State(episode_id=str(uuid4()), step_count=0)

        def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, target: int = 10,
                  **kwargs: Any) -> Observation:
            self.total, self.target = 0, target
            self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
            return Observation(done=False, reward=0.0, metadata={"target": target, "status": "ready"})

        def _step_impl(self, action: Action, timeout_s: Optional[float] = None, **kwargs: Any) -> Observation:
            return Observation(done=False, reward=0.0, metadata={"error": "Use the MCP tools."})

        def _scored(self, action: Action, observation: Observation) -> Observation:
            if isinstance(action, CallToolAction) and action.tool_name == "add":
                observation.done = self.total == self.target
                observation.reward = 1.0 if observation.done else 0.0
            return observation

        def step(self, action: Action, timeout_s: Optional[float] = None, **kwargs: Any) -> Observation:
            self._state.step_count += 1
            return self._scored(action, super().step(action, timeout_s=timeout_s, **kwargs))

        async def step_async(self, action: Action, timeout_s: Optional[float] = None, **kwargs: Any) -> Observation:
            self._state.step_count += 1
            return self._scored(action, await super().step_async(action, timeout_s=timeout_s, **kwargs))

        @property
        def state(self) -> State:
            return self._state
''')

MCP_APP = textwrap.dedent('''
    """FastAPI application for the CLASS environment: uvicorn server.app:app"""

    import os

    try:
        from openenv.core.env_server.http_server import create_app
        from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation

        from .MODULE import CLASS
    except ImportError:
        from openenv.core.env_server.http_server import create_app
        from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
        from server.MODULE import CLASS

    app = create_app(CLASS, CallToolAction, CallToolObservation, env_name="NAME_env",
                     max_concurrent_envs=int(os.getenv("MAX_CONCURRENT_ENVS", "8")))


    def main():
        import uvicorn

        uvicorn.run(app, host="0.0.0.0", port=8000)


    if __name__ == "__main__":
        main()
''')

MCP_CLIENT = textwrap.dedent('''
    """Client for the NAME environment."""

    from openenv.core.mcp_client import MCPToolClient


    class CLASSClient(MCPToolClient):
        pass
''')

WALK_MODELS = textwrap.dedent('''
    """Data models for the walk environment."""

    from typing import List

    from openenv.core.env_server.types import Action, Observation, State
    from pydantic import Field


    class WalkAction(Action):
        """Move one step left (-1) or right (+1)."""

        move: int = Field(..., ge=-1, le=1, description="-1 or +1")


    class WalkObservation(Observation):
        position: int = 0
        target: int = 0
        legal_moves: List[int] = Field(default_factory=list)


    class WalkState(State):
        position: int = 0
        target: int = 0
''')

WALK_ENVIRONMENT = textwrap.dedent('''
    """Walk a number line to the target."""

    import uuid

    from openenv.core.env_server import Environment

    try:
        from ..models import WalkAction, WalkObservation, WalkState
    except ImportError:
        from models import WalkAction, WalkObservation, WalkState


    class WalkEnvironment(Environment):
        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self):
            super().__init__()
            self.reset()

        def reset(self, seed=None, episode_id=None, target: int = 3, **kwargs):
            self.position, self.target = 0, target
            self._state = WalkState(episode_id=episode_id or str(uuid.uuid4()), step_count=0, position=0,
                                    target=target)
            return self._observation()

        def step(self, action: WalkAction, timeout_s=None, **kwargs):
            self.position += action.move
            done = self.position == self.target
            self._state = WalkState(episode_id=self._state.episode_id, step_count=self._state.step_count + 1,
                                    position=self.position, target=self.target)
            return self._observation(reward=1.0 if done else 0.0, done=done)

        def _observation(self, reward=0.0, done=False):
            return WalkObservation(position=self.position, target=self.target, legal_moves=[-1, 1],
                                   reward=reward, done=done, metadata={"distance": abs(self.target - self.position)})

        @property
        def state(self):
            return self._state
''')

WALK_APP = textwrap.dedent('''
    """FastAPI application for the walk environment: uvicorn server.app:app"""

    from openenv.core.env_server import create_app

    try:
        from ..models import WalkAction, WalkObservation, WalkState
        from .walk_environment import WalkEnvironment
    except ImportError:
        from models import WalkAction, WalkObservation, WalkState
        from server.walk_environment import WalkEnvironment

    app = create_app(WalkEnvironment, WalkAction, WalkObservation, env_name="walk_env", state_cls=WalkState,
                     max_concurrent_envs=8)


    def main():
        import uvicorn

        uvicorn.run(app, host="0.0.0.0", port=8000)


    if __name__ == "__main__":
        main()
''')

WALK_CLIENT = textwrap.dedent('''
    """Client for the walk environment."""

    from typing import Dict

    from openenv.core.client_types import StepResult
    from openenv.core.env_client import EnvClient

    try:
        from .models import WalkAction, WalkObservation, WalkState
    except ImportError:
        from models import WalkAction, WalkObservation, WalkState


    class WalkEnv(EnvClient[WalkAction, WalkObservation, WalkState]):
        def _step_payload(self, action: WalkAction) -> Dict:
            return {"move": action.move}

        def _parse_result(self, payload: Dict) -> StepResult[WalkObservation]:
            obs = WalkObservation(**payload["observation"])
            return StepResult(observation=obs, reward=payload.get("reward"), done=payload.get("done", False))

        def _parse_state(self, payload: Dict) -> WalkState:
            return WalkState(**payload)
''')

SNOOP_ENVIRONMENT = textwrap.dedent('''
    """Snoop: a tool that tries what hostile code would, and says what it reached."""

    import os
    import socket
    from typing import Any, Optional

    from fastmcp import FastMCP
    from openenv.core.env_server.mcp_environment import MCPEnvironment
    from openenv.core.env_server.types import Action, Observation, State


    def attempt(fn) -> str:
        try:
            return f"reached: {fn()!r}"[:200]
        except Exception as exc:
            return f"blocked: {type(exc).__name__}"


    class SnoopEnvironment(MCPEnvironment):
        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self):
            mcp = FastMCP("snoop_env")

            @mcp.tool
            def snoop(path: str, port: int) -> dict:
                """Read a host file, connect to a host port, write into the package, list processes."""
                def connect():
                    with socket.create_connection(("127.0.0.1", port), timeout=2):
                        return "connected"

                def write():
                    with open("planted.txt", "w") as f:
                        f.write("x")
                    return "written"

                return {"file": attempt(lambda: open(path).read(64)), "network": attempt(connect),
                        "package": attempt(write),
                        "processes": sorted(int(p) for p in os.listdir("/proc") if p.isdigit())}

            super().__init__(mcp)
            self._state = State(step_count=0)

        def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> Observation:
            return Observation(done=False, reward=0.0, metadata={"status": "ready"})

        def _step_impl(self, action: Action, timeout_s: Optional[float] = None, **kwargs: Any) -> Observation:
            return Observation(done=False, reward=0.0)

        @property
        def state(self) -> State:
            return self._state
''')


def _common(name: str) -> dict[str, str]:
    return {"pyproject.toml": PYPROJECT.replace("NAME", name), "openenv.yaml": OPENENV_YAML.replace("NAME", name),
            "README.md": f"# {name}_env\n\nAn OpenEnv environment.\n", "server/__init__.py": ""}


def mcp_package(name: str, cls: str, source: str) -> dict[str, str]:
    module = f"{name}_environment"
    return {**_common(name), f"server/{module}.py": source,
            "server/app.py": MCP_APP.replace("MODULE", module).replace("CLASS", cls).replace("NAME", name),
            "client.py": MCP_CLIENT.replace("CLASS", cls.removesuffix("Environment")).replace("NAME", name),
            "__init__.py": f"from .client import {cls.removesuffix('Environment')}Client\n"}


def tally() -> dict[str, str]:
    return mcp_package("tally", "TallyEnvironment", TALLY_ENVIRONMENT)


def snoop() -> dict[str, str]:
    return mcp_package("snoop", "SnoopEnvironment", SNOOP_ENVIRONMENT)


def walk() -> dict[str, str]:
    return {**_common("walk"), "models.py": WALK_MODELS, "server/walk_environment.py": WALK_ENVIRONMENT,
            "server/app.py": WALK_APP, "client.py": WALK_CLIENT,
            "__init__.py": "from .client import WalkEnv\nfrom .models import WalkAction, WalkObservation\n"}
