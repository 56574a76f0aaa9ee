"""The phases a solve runs, in the order of `kvbound.solvers.plan.PLAN`. Each offers schedules and
certifies bounds on the ledger (`kvbound.solvers.ledger`), and says itself whether it applies to
what the ledger holds (`Phase`)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ..ledger import Ledger


class Phase(Protocol):
    name: str

    def applies(self, ledger: Ledger) -> bool:
        """Whether to run now, given what the ledger holds (proof, route, time left)."""

    def run(self, ledger: Ledger) -> None:
        """Offer schedules and certify bounds until done or out of its time."""
