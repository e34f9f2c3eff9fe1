"""Ledger: a small OpenEnv environment (the ORS Platform's container test fixture)."""

from ledger_env.models import LedgerAction, LedgerObservation

__all__ = ["LedgerAction", "LedgerObservation"]
