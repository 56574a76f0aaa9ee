"""The model route: build the formulation the route chose, warm-start it from the best heuristic
schedule, run the backend until the deadline, and offer its schedule and certify its bound."""
from __future__ import annotations

import math
import time

from ... import progress
from ...bounds.base import Bound
from ...interrupt import Stopped
from ..export import export_model
from ..ledger import ModelRun


class Model:
    name = "model"

    def __init__(self, backends):
        self.backends = backends

    def applies(self, ledger) -> bool:
        return ledger.route is not None and ledger.route.way != "search"

    def run(self, ledger) -> None:
        instance, options, chosen = ledger.instance, ledger.options, ledger.route
        backend, deadline = self.backends[options.backend], ledger.deadline
        ledger.model = run = ModelRun({"variables": chosen.size})
        row = f"MILP dual bound ({backend.name}, {chosen.kind.name})"
        if ledger.skipped:  # the heuristics proved the optimum, or no model could be built here
            ledger.certify(Bound(row, -math.inf, certified=chosen.certified, note=f"not run: {ledger.skipped}"))
            ledger.export_problem = f"no model was built: {ledger.skipped}"
            return
        form, began = None, time.perf_counter()
        try:
            progress.report(phase="model")
            with deadline.enforced():  # building cannot ask the deadline: it is cut short when it passes
                form = chosen.kind.build(instance, ledger.objective, chosen.J, ledger.constraints, tick=chosen.tick)
                arrays = form.model.finalize()
            run.build_seconds, run.info = time.perf_counter() - began, form.info
            if options.export:
                with deadline.enforced():  # PuLP writes large models slowly: the deadline cuts it too
                    export_model(arrays, form, options.export)
                ledger.exported = options.export
            warm_x, start = None, ledger.upper
            if start is not None and options.warm_start and ledger.constraints.within_cap(start.value):
                warm_x, run.warm_start = form.warm_start(start.schedule), start.name
                bad = arrays.check(warm_x)
                if bad:  # a formulation bug: say so instead of silently starting cold
                    raise RuntimeError(f"warm start from {start.name} violates the {form.name} model: {bad[0]}")
            scale = form.objective_scale()
            progress.report(phase=backend.name, scale=scale, bound_certified=chosen.certified)
            out = backend.run(arrays, deadline, warm_x, verbose=options.verbose)
        except Stopped as stop:  # the model build (or the CBC model) was cut short: the heuristics stand
            if form is None:
                run.build_seconds = time.perf_counter() - began
            ledger.stats["stopped"] = f"{stop.reason} before the solver ran"
            ledger.certify(Bound(row, -math.inf, certified=chosen.certified, note=ledger.stats["stopped"]))
            if ledger.exported is None:
                ledger.export_problem = f"{stop.reason} while {'writing' if form is not None else 'building'} the model"
            return
        run.backend_seconds, run.backend_status, run.warm_start_accepted = out.seconds, out.status, out.warm_start_accepted
        ledger.stats.update(out.stats)
        if out.x is not None:
            schedule = form.extract(out.x)  # None: a first-token prefix that cannot be completed without evicting
            if schedule is not None:
                ledger.offer(schedule, "solver", wins_ties=True)
        value = out.bound / scale if math.isfinite(out.bound) else out.bound
        kept = ledger.certify(Bound(row, value, out.seconds,
                                    certified=chosen.certified, note=f"horizon J = {chosen.J}",
                                    conditions="" if chosen.certified else chosen.why))
        run.solver_bound = kept.value
        run.infeasible = out.status == "infeasible"
