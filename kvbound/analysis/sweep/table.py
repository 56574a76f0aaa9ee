"""A resumable results table: a CSV appended one whole point at a time, read back tolerantly.

Each append is one write followed by fsync, so a killed process leaves whole points and at
most a torn last line. Loading drops the rows of a point that was cut short (a torn last line,
or with `count_column` fewer rows than the point has) and rewrites the file without them, so
that a re-run redoes exactly those points. The sweep and the bench scripts keep their results
in it.
"""
from __future__ import annotations

import csv
import errno
import io
import os
from collections.abc import Callable, Hashable
from pathlib import Path

from ...errors import InputError
from ...fileio import read_user_text, write_user_file


class ResultsTable:
    """Rows of `columns` in the CSV at `path`; `key` (a column or a function of a row) names a row's point.

    Rows read back are strings (empty for None, true/false for booleans).
    """

    def __init__(self, path: str | Path, columns: tuple[str, ...], *, key: str | Callable[[dict], Hashable],
                 count_column: str | None = None):
        self.path = Path(path)
        self.columns = tuple(columns)
        self.key = (lambda row: row[key]) if isinstance(key, str) else key
        self.count_column = count_column  # a column holding how many rows the row's point has
        self.rows: list[dict] = []
        self.dropped = 0  # rows of a point that was cut short, removed on load
        if self.path.exists():
            self._load()

    @property
    def done(self) -> set:
        """The keys of the points in the table (all complete)."""
        return {self.key(r) for r in self.rows}

    def _load(self) -> None:
        text = read_user_text(self.path)  # unreadable or not UTF-8: bad input naming the file
        reader = csv.DictReader(io.StringIO(text))
        if reader.fieldnames is not None and tuple(reader.fieldnames) != self.columns:
            raise InputError(str(self.path), "header", "not a results table of this kvbound version "
                             "(other columns); use another --out folder")
        rows = list(reader)
        torn = bool(text) and not text.endswith("\n")  # the last line was cut mid-write
        bad = self._short_points(rows)
        if torn and rows:
            bad.add(self.key(rows[-1]))
        self.rows = [r for r in rows if self.key(r) not in bad]
        self.dropped = len(rows) - len(self.rows)
        if self.dropped or torn:  # rewrite without the partial point
            write_user_file(self.path, self._csv_text(self.rows, header=True))

    def _short_points(self, rows: list[dict]) -> set:
        if self.count_column is None:
            return set()
        counts: dict = {}
        for r in rows:
            counts[self.key(r)] = counts.get(self.key(r), 0) + 1
        return {self.key(r) for r in rows
                if not (r[self.count_column] or "").isdigit() or counts[self.key(r)] != int(r[self.count_column])}

    def append(self, rows: list[dict]) -> None:
        """The rows of one point, in one write. A write that fails (a full disk) or is cut short leaves the
        file as it was (the point is not recorded, a re-run redoes it) and is bad input naming the file."""
        new = not self.path.exists() or self.path.stat().st_size == 0
        data = self._csv_text(rows, header=new).encode("utf-8")
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as exc:
            raise InputError(str(self.path), "", f"cannot write: {exc.strerror or exc}") from None
        try:
            size = os.fstat(fd).st_size
            try:
                written = os.write(fd, data)  # one write: a killed process leaves whole points, at most a torn line
                if written != len(data):
                    raise OSError(errno.EIO, f"only {written} of {len(data)} bytes written (is the disk full?)")
                os.fsync(fd)
            except OSError as exc:
                try:
                    os.ftruncate(fd, size)  # the points before stay whole; none is half-written
                except OSError:
                    pass  # the next load drops a torn last point anyway
                raise InputError(str(self.path), "", f"cannot write: {exc.strerror or exc}") from None
        finally:
            os.close(fd)
        self.rows.extend({k: _cell(row.get(k)) for k in self.columns} for row in rows)

    def _csv_text(self, rows: list[dict], header: bool) -> str:
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        if header:
            writer.writerow(self.columns)
        for row in rows:
            writer.writerow([_cell(row.get(k)) for k in self.columns])
        return buf.getvalue()


def _cell(v) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    return repr(v) if isinstance(v, float) else str(v)
