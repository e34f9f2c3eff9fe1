"""The ledger's action and observation."""

from openenv.core.env_server.types import Action, Observation
from pydantic import Field


class LedgerAction(Action):
    """Add an amount to the ledger (a line written to its file in /workspace)."""

    amount: int = Field(..., ge=-1000, le=1000)
    note: str = ""


class LedgerObservation(Observation):
    balance: int = 0
    lines: int = 0
    path: str = ""
    jq: str = ""  # the version of the Debian package installed at build
    runtime: dict = Field(default_factory=dict)
