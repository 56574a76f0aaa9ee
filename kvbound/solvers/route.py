"""Which way a solve goes once the heuristics have run: a model (which one, at what horizon) or the
search where no model fits, read from the formulation and backend descriptors."""
from __future__ import annotations

from dataclasses import dataclass

from ..backends import chosen_backends
from ..errors import InputError
from ..formulation import FORMULATION_KINDS, MODEL_LIMIT, FormulationKind
from ..formulation.horizon import horizon_for
from ..formulation.units import tick_for
from ..schedule import Schedule
from ..schedulers.rewrite import first_token_prefix
from ..workload import Instance
from .options import SEARCH, SolveOptions

#: the horizon "auto" sizes its choice at when no schedule gives one
UNKNOWN_HORIZON = 64


@dataclass(frozen=True)
class Route:
    """The model a solve would build: its kind, horizon J (and whether the bound is certified at it,
    and why that horizon), the backends that solve it (several race, each on its own build), CP-SAT's
    time tick and its size in variables; and whether it is built (`way`: "model"), left for the
    search ("search") or not built at all ("none", `why_not`)."""

    kind: FormulationKind
    J: int
    certified: bool
    why: str
    tick: float | None
    size: int
    way: str
    why_not: str = ""
    backends: tuple = ()  # the Backend descriptors, the first one's answer the default winner


def route(instance: Instance, options: SolveOptions, backends: dict, best: Schedule | None, upper: float | None) -> Route:
    """The route for a solve whose best schedule so far (meeting the constraints) is `best`, of value
    `upper` (None: no schedule); `backends`: the registry `options.backend` names one of (or auto)."""
    kind = _kind(instance, options, upper)
    J, certified, why = _horizon(instance, options, kind, upper)
    if best is not None:
        prefix = best
        if options.constraints.stops_at_first_tokens(options.objective):
            prefix = Schedule(instance.requests, first_token_prefix(instance, best.batches))
        J = max(J, kind.batches_needed(prefix))
    size = kind.size(instance, J)
    chosen = chosen_backends(options.backend, size, backends)
    tick = tick_for(instance, J) if any(b.integer_ticks for b in chosen) else None
    way, why_not = "model", ""
    auto = options.formulation == "auto"
    if best is not None and not options.export and (options.formulation == SEARCH or (auto and size > kind.auto_limit)):
        way = "search"
        if not options.formulation == SEARCH:
            why_not = f"the {kind.name} model would have ~{size:,} variables (auto's limit {kind.auto_limit:,}); "
    elif size > MODEL_LIMIT and not options.export:
        way, why_not = "none", f"the {kind.name} model would have ~{size:,} variables (limit {MODEL_LIMIT:,})"
    return Route(kind, J, certified, why, tick, size, way, why_not, chosen)


def _kind(instance: Instance, options: SolveOptions, upper: float | None) -> FormulationKind:
    """The named formulation, or for "auto" (and the search, which sizes the model it does without)
    the first one in `FORMULATION_KINDS` that `auto` may pick, can express the constraints and stays
    within its limit at the horizon it would get; else the last of those."""
    if options.formulation in FORMULATION_KINDS:
        return FORMULATION_KINDS[options.formulation]
    candidates = [k for k in FORMULATION_KINDS.values() if k.auto_limit and k.expresses(options.constraints)]
    for kind in candidates:
        if options.horizon:
            J = options.horizon
        elif upper is not None:
            J = horizon_for(instance, options.objective, upper, not options.constraints.no_evict, kind.folds_evict_only)[0]
        else:
            J = UNKNOWN_HORIZON
        if kind.size(instance, J) <= kind.auto_limit:
            return kind
    return candidates[-1]


def _horizon(instance: Instance, options: SolveOptions, kind: FormulationKind, upper: float | None) -> tuple[int, bool, str]:
    """(J, certified, reason): the derived horizon, or the given one (certified only if >= the derived)."""
    if upper is not None:
        j_cert, certified, why = horizon_for(instance, options.objective, upper,
                                             allow_evict=not options.constraints.no_evict,
                                             evict_batches_implicit=kind.folds_evict_only)
    else:
        j_cert, certified, why = None, False, "no schedule meets the constraints to derive a horizon from"
    if options.horizon is None:
        if j_cert is None:
            # named by the field, so the CLI says `--horizon` only where the command has that flag
            raise InputError("", "horizon", "cannot be derived: no heuristic schedule meets the constraints; give one")
        return j_cert, certified, why
    J = int(options.horizon)
    certified = certified and j_cert is not None and J >= j_cert
    why = f"horizon J = {J} given" + ("" if certified else f" (a certified horizon needs J >= {j_cert})" if j_cert else "")
    return J, certified, why
