"""The one atomic file writer: write beside the target, flush to disk, rename.

Readers never see half a file, and a failed write leaves neither the target changed nor a
temporary file behind.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from .errors import InputError


def write_atomic(path: str | Path, data: str | bytes, *, encoding: str = "utf-8") -> Path:
    """Write `data` (text or bytes) to `path` atomically; returns the path."""
    path = Path(path)
    raw = data.encode(encoding) if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent if str(path.parent) else ".")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(raw)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def write_user_file(path: str | Path, data: str | bytes) -> Path:
    """`write_atomic` for a file the user named: a failed write is bad input naming the file (exit 2)."""
    try:
        return write_atomic(path, data)
    except OSError as exc:
        raise InputError(str(path), "", f"cannot write file: {exc.strerror or exc}") from None


def write_json_atomic(path: str | Path, data) -> Path:
    """Compact JSON plus a newline, atomically."""
    return write_atomic(path, json.dumps(data, indent=None, separators=(",", ":")) + "\n")


def save_figure_atomic(fig, path: str | Path, **savefig_kwargs) -> Path:
    """A matplotlib figure in the format its suffix names, atomically."""
    import io

    path = Path(path)
    buffer = io.BytesIO()
    fmt = path.suffix.lstrip(".").lower() or None
    fig.savefig(buffer, format=fmt, **savefig_kwargs)
    return write_atomic(path, buffer.getvalue())
