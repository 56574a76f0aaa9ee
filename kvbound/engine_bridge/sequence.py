"""One request as the executor sees it: its tokens, its cached prefix and its block table."""
from __future__ import annotations

from dataclasses import dataclass, field


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
        return self.generated >= 1 and self.uncached == 1
