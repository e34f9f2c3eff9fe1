"""A ledger in /workspace: each step appends a line to the episode's file and the observation
reads the file back, so what a step wrote is what the next one sees."""

import importlib.metadata
import os
import subprocess
import sys
import uuid

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import State

from ledger_env.models import LedgerAction, LedgerObservation

WORKSPACE = os.environ.get("WORKSPACE_DIR", "/workspace")
TARGET = 10


def _jq() -> str:
    return subprocess.run(["jq", "--version"], capture_output=True, text=True, check=True).stdout.strip()


class LedgerEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id=str(uuid.uuid4()), step_count=0)
        self._path = ""
        self._jq = ""

    def _observe(self, reward=None, done=False) -> LedgerObservation:
        with open(self._path) as f:
            amounts = [int(line.split("\t")[0]) for line in f if line.strip()]
        runtime = {"python": sys.prefix, "openenv": importlib.metadata.version("openenv"),
                   "web_interface": "openenv.core.env_server.web_interface" in sys.modules}
        return LedgerObservation(balance=sum(amounts), lines=len(amounts), path=self._path, jq=self._jq,
                                 runtime=runtime, reward=reward, done=done)

    def reset(self, seed=None, episode_id=None, start: int = 0, **kwargs) -> LedgerObservation:
        self._state = State(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
        os.makedirs(WORKSPACE, exist_ok=True)
        self._path = os.path.join(WORKSPACE, f"{self._state.episode_id}.ledger")
        self._jq = self._jq or _jq()  # the Debian package, asked once per instance
        with open(self._path, "w") as f:
            if start:
                f.write(f"{int(start)}\topening\n")
        return self._observe()

    def step(self, action: LedgerAction, timeout_s=None, **kwargs) -> LedgerObservation:
        self._state.step_count += 1
        with open(self._path, "a") as f:
            f.write(f"{action.amount}\t{action.note}\n")
        observation = self._observe()
        observation.reward = float(observation.balance)
        observation.done = observation.balance >= TARGET
        return observation

    @property
    def state(self) -> State:
        return self._state
