"""The model route: build the formulation the route chose (once per backend of the route: seconds
or integer ticks), warm-start it from the best heuristic schedule, run the backend, or race the
backends (`kvbound.backends.race`), until the deadline, and offer every schedule and certify every
bound they end with, each under its backend's name; the winner's answer is the one the result names."""
from __future__ import annotations

import math
import time

from ... import progress
from ...bounds.base import Bound
from ...interrupt import Stopped
from ...backends.race import Entrant, race
from ...schedule import validate
from ..export import export_model
from ..ledger import ModelRun


class Model:
    name = "model"

    def applies(self, ledger) -> bool:
        return ledger.route is not None and ledger.route.way != "search"

    def run(self, ledger) -> None:
        instance, options, chosen = ledger.instance, ledger.options, ledger.route
        backends, deadline = chosen.backends, ledger.deadline
        ledger.model = run = ModelRun({"variables": chosen.size})
        rows = {b.name: f"MILP dual bound ({b.name}, {chosen.kind.name})" for b in backends}
        if ledger.skipped:  # the heuristics proved the optimum, or no model could be built here
            for row in rows.values():
                ledger.certify(Bound(row, -math.inf, certified=chosen.certified, note=f"not run: {ledger.skipped}"))
            ledger.export_problem = f"no model was built: {ledger.skipped}"
            return
        forms, began = [], time.perf_counter()
        try:
            progress.report(phase="model")
            with deadline.enforced():  # building cannot ask the deadline: it is cut short when it passes
                for backend in backends:  # one build per backend: integer ticks or seconds
                    form = chosen.kind.build(instance, ledger.objective, chosen.J, ledger.constraints,
                                             tick=chosen.tick if backend.integer_ticks else None)
                    forms.append((form, form.model.finalize()))
            run.build_seconds, run.info = time.perf_counter() - began, forms[0][0].info
            if options.export:
                with deadline.enforced():  # PuLP writes large models slowly: the deadline cuts it too
                    export_model(forms[0][1], forms[0][0], options.export)
                ledger.exported = options.export
            exact = lambda schedule: ledger.objective.of(validate(instance, schedule).metrics)  # noqa: E731
            entrants = [Entrant(backend, arrays, self._warm(ledger, form, arrays, run), form.objective_scale(),
                                form.extract, form.warm_start, exact) for backend, (form, arrays) in zip(backends, forms)]
            progress.report(phase="+".join(b.name for b in backends), scale=entrants[0].scale,
                            bound_certified=chosen.certified)
            if len(entrants) == 1:
                e = entrants[0]
                outcomes, winner = [e.backend.run(e.arrays, deadline, e.warm, verbose=options.verbose)], 0
            else:
                raced = race(entrants, deadline, options.verbose)
                outcomes, winner = raced.outcomes, raced.winner
                ledger.stats["race"] = self._race_stats(entrants, raced)
        except Stopped as stop:  # the model build (or the CBC model) was cut short: the heuristics stand
            if len(forms) < len(backends):
                run.build_seconds = time.perf_counter() - began
            ledger.stats["stopped"] = f"{stop.reason} before the solver ran"
            for row in rows.values():
                ledger.certify(Bound(row, -math.inf, certified=chosen.certified, note=ledger.stats["stopped"]))
            if ledger.exported is None:
                ledger.export_problem = f"{stop.reason} while {'writing' if forms else 'building'} the model"
            return
        out = outcomes[winner]
        ledger.backend = backends[winner].name
        run.backend_seconds, run.backend_status, run.warm_start_accepted = out.seconds, out.status, out.warm_start_accepted
        ledger.stats.update(out.stats)
        for k in [winner] + [k for k in range(len(outcomes)) if k != winner]:  # the winner's schedule wins ties
            outcome, entrant = outcomes[k], entrants[k]
            if outcome is None:
                ledger.certify(Bound(rows[entrant.backend.name], -math.inf, certified=chosen.certified,
                                     note="not run: another solver settled the race first"))
                continue
            if outcome.x is not None:
                schedule = entrant.to_schedule(outcome.x)  # None: a first-token prefix that cannot be completed without evicting
                if schedule is not None:
                    ledger.offer(schedule, "solver", wins_ties=k == winner)
            value = outcome.bound / entrant.scale if math.isfinite(outcome.bound) else outcome.bound
            kept = ledger.certify(Bound(rows[entrant.backend.name], value, outcome.seconds,
                                        certified=chosen.certified, note=f"horizon J = {chosen.J}",
                                        conditions="" if chosen.certified else chosen.why))
            if k == winner:
                run.solver_bound = kept.value
            run.infeasible = run.infeasible or outcome.status == "infeasible"

    @staticmethod
    def _warm(ledger, form, arrays, run):
        """The best schedule so far as a point of `form`'s model (None: none, or not asked for)."""
        start = ledger.upper
        if start is None or not ledger.options.warm_start or not ledger.constraints.within_cap(start.value):
            return None
        warm_x, run.warm_start = form.warm_start(start.schedule), start.name
        bad = arrays.check(warm_x)
        if bad:  # a formulation bug: say so instead of silently starting cold
            raise RuntimeError(f"warm start from {start.name} violates the {form.name} model: {bad[0]}")
        return warm_x

    @staticmethod
    def _race_stats(entrants, raced) -> dict:
        """Each racer's answer (seconds, status, best and bound in seconds), the winner, the sharing."""
        each = {}
        for entrant, outcome, finished in zip(entrants, raced.outcomes, raced.finished):
            if outcome is None:
                each[entrant.backend.name] = {"status": "not run"}
                continue
            each[entrant.backend.name] = {
                "status": outcome.status, "seconds": round(finished, 3),
                "objective": None if outcome.objective is None else outcome.objective / entrant.scale,
                "bound": outcome.bound / entrant.scale if math.isfinite(outcome.bound) else None}
        return {"winner": entrants[raced.winner].backend.name, "shared_solutions": raced.shared, **each}
