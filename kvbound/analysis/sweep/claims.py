"""A sweep's claims ([[claim]] in the spec): each checked at every point it covers, with a verdict.

At a point, a claim holds when its `better` scheduler's metric beats every `than` scheduler's by the
factor `by` (lower is better unless `higher`); over the sweep it holds when it holds at every covered
point (a refused row or a missing value makes the point fail). The report gives the verdict with the
numbers: per point the values and the ratio other / better (better / other with `higher`).
"""
from __future__ import annotations

from dataclasses import dataclass

from .spec import GRID_KEYS, ClaimSpec


@dataclass
class PointVerdict:
    params: dict
    values: dict  # scheduler -> value (None: refused)
    ratios: dict  # each `than` scheduler -> other / better (better / other with higher); None if undefined
    holds: bool


@dataclass
class ClaimVerdict:
    claim: ClaimSpec
    points: list[PointVerdict]

    @property
    def holds(self) -> bool:
        return bool(self.points) and all(p.holds for p in self.points)

    @property
    def verdict(self) -> str:
        return "holds" if self.holds else "fails"


def _ratio(better, other, higher: bool):
    if better is None or other is None:
        return None
    num, den = (better, other) if higher else (other, better)
    return num / den if den > 0 else (float("inf") if num > 0 else 1.0)


def check_claims(claims: list[ClaimSpec], rows: list[dict], param_keys=GRID_KEYS + ("objective",)) -> list[ClaimVerdict]:
    by_point: dict[str, dict[str, dict]] = {}
    for r in rows:
        by_point.setdefault(r["point"], {})[r["scheduler"]] = r
    out = []
    for claim in claims:
        points = []
        for per in by_point.values():
            params = {k: next(iter(per.values())).get(k) for k in param_keys}
            if not claim.covers(params):
                continue
            values = {s: (per[s].get(claim.metric) if s in per and per[s]["status"] != "refused" else None)
                      for s in (claim.better, *claim.than)}
            ratios = {s: _ratio(values[claim.better], values[s], claim.higher) for s in claim.than}
            holds = all(r is not None and r >= claim.by * (1 - 1e-12) for r in ratios.values())
            points.append(PointVerdict(params, values, ratios, holds))
        out.append(ClaimVerdict(claim, points))
    return out


def claims_markdown(verdicts: list[ClaimVerdict], varying: list[str]) -> str:
    """The claims table (one line each) and, per claim, its points."""
    lines = ["| claim | metric | verdict | points holding | ratio (other / claimed better) |", "|---|---|---|---:|---|"]
    for v in verdicts:
        c = v.claim
        ratios = [r for p in v.points for r in p.ratios.values() if r is not None]
        span = f"{min(ratios):.3g}-{max(ratios):.3g}x (needs >= {c.by:g}x)" if ratios else "-"
        lines.append(f"| {c.text} | {c.metric} | **{v.verdict}** | {sum(p.holds for p in v.points)} / {len(v.points)} | {span} |")
    for k, v in enumerate(verdicts):
        c = v.claim
        lines += ["", f"### Claim {k + 1}: {c.text}", "",
                  "| " + " | ".join(varying + [c.better] + list(c.than) + [f"{s} ratio" for s in c.than] + ["holds"]) + " |",
                  "|" + "---|" * len(varying) + "---:|" * (1 + 2 * len(c.than)) + "---|"]
        for p in v.points:
            vals = [_fmt(p.values[s]) for s in (c.better, *c.than)]
            rat = ["-" if p.ratios[s] is None else f"{p.ratios[s]:.3g}x" for s in c.than]
            lines.append("| " + " | ".join([str(p.params[g]) for g in varying] + vals + rat + ["yes" if p.holds else "no"]) + " |")
    return "\n".join(lines)


def _fmt(v) -> str:
    return "refused" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v))
