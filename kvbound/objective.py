"""The objectives kvbound optimises: parsed once at the edge, then an enum everywhere."""
from __future__ import annotations

from enum import StrEnum

from .errors import InputError


class Objective(StrEnum):
    """A latency objective; its value is the `Metrics` field it reads (and the JSON/CLI name)."""

    TOTAL_LATENCY = "total_latency"  # end of the last batch (makespan)
    MEAN_LATENCY = "mean_latency"  # mean of completion - arrival
    MEAN_TTFT = "mean_ttft"  # mean of first token - arrival

    @property
    def is_mean(self) -> bool:
        """A mean over requests (summed per request in the models), not the makespan."""
        return self is not Objective.TOTAL_LATENCY

    @property
    def first_token(self) -> bool:
        """Counts each request's first token, not its completion."""
        return self is Objective.MEAN_TTFT

    @property
    def label(self) -> str:
        return self.value.replace("_", " ").replace("ttft", "TTFT")

    def of(self, metrics) -> float:
        """This objective's value in a `Metrics` (seconds)."""
        return float(getattr(metrics, self.value))

    @classmethod
    def parse(cls, text, source: str = "", field: str = "objective") -> "Objective":
        """The objective named `text`; an `InputError` naming `source` and `field` otherwise."""
        if isinstance(text, cls):
            return text
        try:
            return cls(text)
        except ValueError:
            raise InputError(source, field, f"unknown objective {text!r}; choose from {', '.join(OBJECTIVES)}") from None


OBJECTIVES = tuple(o.value for o in Objective)
