"""Re-predict the replays of a GPU session under other calibrations, without a GPU.

    python bench/replay_refit.py PROFILE.csv BATCHES [--decode-share rows 0.5 ...] [--csv OUT.csv] [--out OUT.md]

A GPU session (bench/gpu_session.sh) leaves the profile it fitted and, per replayed schedule, each
batch's cost features, path and measured time (`kvbound replay --json`'s per_batch, gathered in
replays.jsonl). BATCHES is that replays.jsonl, or the CSV `--csv` writes from it (one row per batch:
the form kept in bench/results). For each `--decode-share` (`rows`: every profile batch weighs the
same) this fits the profile with `kvbound.costs.calibrate` as `kvbound calibrate` does and reports,
per schedule, the total, mean and max per-batch error of the predictions against the measured times,
and the share of batches over 12%, overall and per path (graph, pieces, eager).
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from pathlib import Path

import numpy as np

from kvbound.costs.calibrate import FEATURE_COLUMNS, calibrate, read_profile
from kvbound.fileio import write_atomic

COLUMNS = ("schedule", "path", "decode_requests", *FEATURE_COLUMNS, "measured")


def read_batches(path: Path) -> list[dict]:
    """Rows of COLUMNS from a replays.jsonl or from the CSV `--csv` wrote."""
    if path.suffix == ".jsonl":
        return [{"schedule": d["schedule"], "path": b["path"], "decode_requests": b["decode_requests"],
                 **dict(zip(FEATURE_COLUMNS, b["features"])), "measured": b["measured"]}
                for d in map(json.loads, path.read_text().splitlines()) for b in d["per_batch"]]
    return list(csv.DictReader(path.open()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("profile")
    parser.add_argument("batches")
    parser.add_argument("--decode-share", nargs="+", default=["rows", "0.5"])
    parser.add_argument("--csv", help="write the batches here as CSV (one row per replayed batch)")
    parser.add_argument("--out", help="write the table here (markdown)")
    args = parser.parse_args()
    rows = read_batches(Path(args.batches))
    if args.csv:
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, COLUMNS)
        writer.writeheader()
        writer.writerows({k: (f"{v:.9g}" if isinstance(v, float) else v) for k, v in r.items()} for r in rows)
        write_atomic(args.csv, buffer.getvalue())
    features, seconds = read_profile(args.profile)
    schedules = list(dict.fromkeys(r["schedule"] for r in rows))
    lines = ["| decode share | intercept (ms) | schedule | batches | total error | mean batch error | max batch error "
             "| over 12% (graph / pieces / eager) |", "|---|---:|---|---:|---:|---:|---:|---|"]
    for share in args.decode_share:
        cal = calibrate(features, seconds, decode_share=None if share == "rows" else float(share))
        for name in schedules:
            mine = [r for r in rows if r["schedule"] == name]
            f = np.array([[float(r[c]) for c in FEATURE_COLUMNS] for r in mine])
            measured = np.array([float(r["measured"]) for r in mine])
            paths = np.array([r["path"] for r in mine])
            predicted = cal.cost.predict(f)
            rel = np.abs(predicted - measured) / measured
            over = " / ".join(str(int((rel[paths == p] > 0.12).sum())) for p in ("graph", "pieces", "eager"))
            lines.append(f"| {share} | {cal.cost.intercept * 1e3:.2f} | {name} | {len(mine)} | "
                         f"{abs(predicted.sum() - measured.sum()) / measured.sum():.2%} | {rel.mean():.2%} | "
                         f"{rel.max():.1%} | {over} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        write_atomic(args.out, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
