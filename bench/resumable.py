"""The resumable results table the bench scripts share: rows are appended to a CSV as each point
finishes (one write, flushed and fsynced, so an interrupted run loses nothing) and a re-run
skips the points already there; the Markdown view is rewritten atomically."""
from __future__ import annotations

import csv
import os
from pathlib import Path

from tqdm import tqdm


def run_points(out: Path, columns, points, key_of_point, key_of_row, run, desc: str) -> dict:
    """Rows by key: those already in `out`, then `run(*point)` for every point not there yet."""
    out.parent.mkdir(parents=True, exist_ok=True)
    done = {}
    if out.exists():
        with open(out, newline="") as fh:
            done = {key_of_row(row): row for row in csv.DictReader(fh)}
    todo = [p for p in points if key_of_point(p) not in done]
    new_file = not out.exists()
    with open(out, "a", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns)
        if new_file:
            writer.writeheader()
        for p in tqdm(todo, desc=desc, unit="pt"):
            row = run(*p)
            writer.writerow(row)
            fh.flush()
            os.fsync(fh.fileno())  # a finished point is on disk before the next starts
            done[key_of_row(row)] = row
    return done


def write_text_atomic(path: Path, lines: list[str]) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(path)
