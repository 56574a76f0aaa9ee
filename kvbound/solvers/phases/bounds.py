"""The one-shot bounds of a stage (`kvbound.bounds.base.Stage`), each certified on the ledger."""
from __future__ import annotations

from ... import interrupt
from ...bounds.base import Stage, registered


class Bounds:
    """Every registered one-shot bound of `stage` that can run on what is known, one after the
    other, each with its share of the time left: the first stage before anything else, the model
    stage before a model where every bound is asked for, the search stage inside the search
    (`phases.search`)."""

    def __init__(self, stage: Stage):
        self.stage, self.name = stage, f"{stage.value} bounds"

    def applies(self, ledger) -> bool:
        if self.stage is Stage.MODEL:
            return (ledger.options.every_bound and ledger.route is not None and ledger.route.way == "model"
                    and not ledger.deadline.expired())
        return True

    def run(self, ledger) -> None:
        for method in registered(self.stage):
            if self.stage is Stage.SEARCH and ledger.proven:
                return
            if interrupt.requested() is not None:
                # one that came before this stage (while the command imported, or where a phase only
                # polls) stops it as one during a method does: the analytic bounds do not poll
                return
            if method.skip_reason(ledger) is not None:
                continue
            for bound in method.compute(ledger, ledger.deadline.share(method.share)):
                kept = ledger.certify(bound)
                if self.stage is Stage.FIRST and kept.certified and kept.found:
                    ledger.analytic = max(ledger.analytic, kept.value)
                if bound.details is not None:
                    ledger.stats[method.name] = {**bound.details, "bound": kept.value if kept.found else None}
