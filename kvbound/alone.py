"""What a request needs alone: the fewest batches, the least work of each token and the least time.

Every bound, the horizon of the models and the srpt scheduler start from these facts, so each is
written once here (docs/formulation.md, "Bounds"). "Work" is the part of a batch's time that
belongs to one request: everything but the intercept (`CostModel.work`; the convex token term,
>= 0, is left out, so these stay lower bounds).
"""
from __future__ import annotations

import numpy as np

from .objective import Objective
from .workload import Instance, Request


def fewest_batches(uncached, tokens_left, max_prefill_tokens: int):
    """The fewest batches that process `uncached` tokens (at most `max_prefill_tokens` a batch) and
    then generate the rest of `tokens_left` tokens, one a batch: ceil(uncached / P) + tokens_left - 1.
    Ints or numpy arrays; `tokens_left` >= 1."""
    return -(-uncached // max_prefill_tokens) + tokens_left - 1


def prefill_work(tokens, cost):
    """The least work of processing `tokens` tokens (an int or an array) into an empty cache, a
    first prefill or a refill: any chunks' attention telescopes to tokens^2, and at least one chunk
    is prefill-type (`CostModel.work` of one chunk from nothing cached)."""
    tokens = tokens.astype(float) if isinstance(tokens, np.ndarray) else float(tokens)
    return cost.work(tokens, 0.0, decode=False)


def first_prefill_work(prompt, cost, chunk: int | None = None):
    """The least work of a first prefill of `prompt` tokens (an int or an array) in chunks of at most
    `chunk` tokens (min(P, C); None: no limit): `prefill_work`, and where more than one chunk is needed,
    q = ceil(I / chunk), each further chunk's per-request term and its prefill_kv on the tokens cached
    before it. The j-th chunk from the last starts with at least I - j chunk cached (the last j chunks
    hold at most j chunk tokens), so the q - 1 later chunks read at least sum_{j < q} (I - j chunk)."""
    work = prefill_work(prompt, cost)
    if chunk is None:
        return work
    prompt = np.asarray(prompt, dtype=float)
    q = np.ceil(prompt / chunk)
    # sum_{j=1}^{q-1} (I - j chunk) = (q - 1) I - chunk q (q - 1) / 2
    read = (q - 1) * prompt - chunk * q * (q - 1) / 2
    return work + (q - 1) * cost.per_prefill_request + cost.prefill_kv * read


def token_work(r: Request, cost, chunk: int | None = None) -> np.ndarray:
    """The least work of each of request r's tokens: its first prefill for the first (in chunks of at
    most `chunk` tokens, `first_prefill_work`); for token k >= 2, after token k - 1 the request holds
    m = I + k - 2 tokens, and either a decode generates it or the m tokens were evicted and all m + 1
    are processed again, whichever works less."""
    m = r.prompt + np.arange(2, r.output + 1) - 2.0
    later = np.minimum(cost.work(1.0, m, decode=True), prefill_work(m + 1, cost))
    return np.r_[first_prefill_work(r.prompt, cost, chunk), later]


def refilled_token_work(prompt, generated, cost):
    """The least work of token `generated` + 1 (`generated` >= 1) of a request evicted after its
    `generated`-th token and before that one: all S = prompt + generated tokens are processed again from
    nothing, the last one either in a prefill-type chunk (the chunks' attention telescopes to S^2) or
    as a decode after the first S - 1 were refilled (prefill-type chunks, at least one). Never less
    than `token_work`'s figure for that token, which takes the cheaper of a decode and the first way."""
    S = prompt + generated
    return np.minimum(prefill_work(S, cost), prefill_work(S - 1, cost) + cost.work(1.0, S - 1.0, decode=True))


def least_work(r: Request, cost, chunk: int | None = None) -> float:
    """The least work that request r adds to any complete schedule (prefill chunks of at most `chunk`)."""
    return float(token_work(r, cost, chunk).sum())


class TokenWindows:
    """Per request, what a window of its tokens costs at least (docs/formulation.md, "Window schedules"):
    each token's least work (`token_work`, prefill chunks of at most min(C, P)), its output and its
    fewest batches; and the intercept. The window plans and the window-rank bound read these."""

    def __init__(self, instance: Instance):
        s, cost = instance.system, instance.cost
        chunk = min(s.max_batch_tokens, s.max_prefill_tokens)
        self.n, self.k0 = len(instance), cost.intercept
        self.work = [token_work(r, cost, chunk) for r in instance.requests]
        self.output = instance.outputs.astype(np.int64)
        self.fewest = np.asarray(fewest_batches(instance.prompts, instance.outputs, chunk), dtype=np.int64)


def largest_chunk(instance: Instance) -> int:
    """The most tokens one batch prefills of a request: min(P, C)."""
    s = instance.system
    return min(s.max_prefill_tokens, s.max_batch_tokens)


def minimum_work(instance: Instance) -> float:
    """A lower bound on the work (non-intercept time) of any complete schedule (docs/formulation.md)."""
    chunk = largest_chunk(instance)
    return sum(least_work(r, instance.cost, chunk) for r in instance.requests)


def tokens_waited(instance: Instance, objective: Objective) -> np.ndarray:
    """Per request, the tokens the objective waits for: its first (mean TTFT) or all of them."""
    return np.ones(len(instance), dtype=np.int64) if objective.first_token else instance.outputs.astype(np.int64)


def batches_alone(instance: Instance, objective: Objective) -> np.ndarray:
    """Per request, the fewest batches from its arrival to the objective's token (its last or first)."""
    P = instance.system.max_prefill_tokens
    return fewest_batches(instance.prompts, tokens_waited(instance, objective), P)


def work_alone(instance: Instance, objective: Objective) -> np.ndarray:
    """Per request, its least work up to the objective's token (its first prefill's for mean TTFT)."""
    chunk = largest_chunk(instance)
    if objective.first_token:
        return first_prefill_work(instance.prompts, instance.cost, chunk)
    return np.array([least_work(r, instance.cost, chunk) for r in instance.requests])


def time_alone(instance: Instance, objective: Objective) -> np.ndarray:
    """Per request, the least time from its arrival to the objective's token (its last or first), even
    alone: its fewest batches' intercepts and its least work."""
    return instance.cost.intercept * batches_alone(instance, objective) + work_alone(instance, objective)


def remaining_alone(cost, max_prefill_tokens: int, prompt: int, output: int, cached: int,
                    generated: int) -> tuple[int, float, float]:
    """A request in a state (`cached` m tokens, `generated` n) run alone to its end:
    (batches, time, work of its prefill chunks). A decode-type request (n >= 1, one token uncached)
    decodes one token a batch; any other processes its S - m uncached tokens in chunks of P (their
    work as one chunk's, which is what chunks cost at least) and then decodes the rest."""
    S = prompt + generated
    uncached, left = S - cached, output - generated
    if generated >= 1 and uncached == 1:
        batches, prefill, first_decode = left, 0.0, 0
    else:
        batches = int(fewest_batches(uncached, left, max_prefill_tokens))
        prefill, first_decode = float(cost.work(float(uncached), float(cached), decode=False)), 1
    # the decodes that follow hold S - 1 + k cached tokens, k = first_decode .. left - 1
    decodes = left - first_decode
    held = decodes * (S - 1) + (first_decode + left - 1) * decodes / 2
    decode = cost.per_token * decodes + cost.decode_kv * held
    return batches, batches * cost.intercept + prefill + decode, prefill
