"""One request as the executor sees it: its tokens, its cached prefix and its block table."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..accounting import account_batch, is_decode_type


@dataclass(eq=False)
class Sequence:
    """m = `cached`, n = `generated` of docs/semantics.md section 2; S = len(tokens)."""

    id: int
    tokens: list[int]  # prompt, then the generated tokens (the last one not yet cached)
    prompt_len: int
    max_output: int  # O
    cached: int = 0  # m: tokens whose KV is in the pool
    block_table: list[int] = field(default_factory=list)

    @property
    def generated(self) -> int:
        return len(self.tokens) - self.prompt_len

    @property
    def finished(self) -> bool:
        return self.generated == self.max_output

    @property
    def uncached(self) -> int:
        return len(self.tokens) - self.cached

    @property
    def decode_type(self) -> bool:
        """Decode-type when it has generated a token and only that token is uncached (section 3)."""
        return is_decode_type(self.generated, self.uncached)


def work_features(work: list[tuple[Sequence, int]]) -> np.ndarray:
    """The six cost features of a batch that processes c tokens of each (sequence, c), from the
    sequences' own state (docs/semantics.md section 6)."""
    tokens = {k: c for k, (_, c) in enumerate(work)}
    account = account_batch(tokens, [s.cached for s, _ in work], [s.generated for s, _ in work],
                            [s.prompt_len for s, _ in work])
    return np.array(account.features, dtype=float)
