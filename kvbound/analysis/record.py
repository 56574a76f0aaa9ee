"""A folder that keeps the finished units of a long command, so that a rerun computes only the rest.

`UnitRecord(folder, instance)` reads FOLDER/units.csv (a `ResultsTable`: appended one unit at a time
with fsync, a torn last line dropped on load). Each unit is keyed by a hash of the case's content and
of the settings that determine its result (`sweep.spec.point_key`), so a unit is reused only where
the same case and settings would compute it again; units of other settings stay in the file and are
ignored. Results are stored as JSON.
"""
from __future__ import annotations

import json
from pathlib import Path

from .. import interrupt
from ..errors import InputError
from ..fileio import check_out_folder
from ..workload import Instance
from .sweep.spec import point_key
from .sweep.table import ResultsTable

#: the columns of FOLDER/units.csv: the unit's name (for a reader), its key, its result as JSON
COLUMNS = ("unit", "key", "result")
FILE_NAME = "units.csv"


class UnitRecord:
    """The units recorded in `folder` for `instance`'s case (the folder is made if missing): `get` a
    finished unit's result by its `key`, `put` one as it finishes; `reused` counts the results taken."""

    def __init__(self, folder: str | Path, instance: Instance):
        self.folder = check_out_folder(folder)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InputError(str(self.folder), "", f"cannot create the folder: {exc.strerror or exc}") from None
        self.table = ResultsTable(self.folder / FILE_NAME, COLUMNS, key="key")
        self.instance = instance
        self._found = {r["key"]: r["result"] for r in self.table.rows}
        self.reused = 0  # units taken from the file in this run

    def key(self, **settings) -> str:
        """The key of a unit: the case's content and `settings` (JSON values)."""
        return point_key(self.instance, settings)

    def get(self, key: str):
        """The recorded result of the unit `key`, or None."""
        text = self._found.get(key)
        if text is None:
            return None
        try:
            result = json.loads(text)
        except ValueError:
            raise InputError(str(self.table.path), "result", f"unit {key}: not JSON; remove the line or use another folder") from None
        self.reused += 1
        return result

    def put(self, unit: str, key: str, result) -> None:
        """Append a finished unit (whole, whatever interrupt comes meanwhile)."""
        text = json.dumps(result)
        with interrupt.deferred():
            self.table.append([{"unit": unit, "key": key, "result": text}])
        self._found[key] = text
