"""The certified horizon: how many batches a model needs so that it admits an optimal schedule."""
from __future__ import annotations

import math

from ..alone import time_alone, work_alone
from ..errors import InputError
from ..objective import Objective
from ..workload import MAX_INT, Instance


def horizon_for(instance: Instance, objective: Objective, upper_bound: float, allow_evict: bool = True,
                evict_batches_implicit: bool = False) -> tuple[int, bool, str]:
    """(J, certified, reason): a batch count that admits an optimal schedule, given the latency
    `upper_bound` of a valid schedule for the same objective and constraints.

    Every processing batch costs at least the intercept, and every schedule spends at least its
    requests' least work (`alone.work_alone`) on top of its intercepts, which bounds the processing
    batches. A batch that processes nothing is only needed to evict a request that the next batch
    refills (other evictions move into the next batch); at most one before each processing batch,
    unless the formulation represents such a batch inside the next one (`evict_batches_implicit`).
    """
    cost = instance.cost
    n = len(instance)
    work = float(work_alone(instance, objective).sum())
    if not objective.is_mean:
        budget = upper_bound
    else:
        # The last completion (first token) of an optimal schedule comes at most at the sum of all of them,
        # n * mean + sum of arrivals, less what every other request needs at least after its arrival.
        own = instance.arrivals + time_alone(instance, objective)
        budget = n * upper_bound + float(instance.arrivals.sum()) - float(own.sum() - own.max())
    batches = (budget - work) / cost.intercept * (1 + 1e-12) + 1e-9
    if not batches < MAX_INT:  # where no model could be built anyway
        raise InputError("", "horizon", f"cannot be derived: the upper bound allows {batches:.3g} batches; give one")
    processing = max(0, math.floor(batches))
    horizon = processing if (not allow_evict or evict_batches_implicit) else 2 * processing
    if objective.first_token:
        if allow_evict:  # the model stops at the first tokens; any prefix can then be completed by evicting
            return max(horizon, 1), True, "batches up to the last first token <= (bound on its time - prefill work) / intercept"
        # without evictions only decodes are left after the last first token, one token per batch at least
        tail = sum(r.output - 1 for r in instance.requests)
        return horizon + tail, True, "first-token phase bounded by the upper bound, then at most sum(O - 1) decode batches"
    return max(horizon, 1), True, "batches <= (upper bound - minimum work) / intercept"
