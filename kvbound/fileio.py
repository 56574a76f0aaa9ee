"""Files and streams: the one atomic file writer (write beside the target, flush to disk, rename),
the checks of user paths, and native code's stdout kept off kvbound's own.

Readers never see half a file, and a failed write leaves neither the target changed nor a
temporary file behind.
"""
from __future__ import annotations

import contextlib
import ctypes
import json
import os
import stat
import sys
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


def write_user_json(path: str | Path, data) -> Path:
    """`write_json_atomic` for a file the user named (a failed write is bad input, exit 2)."""
    return write_user_file(path, json.dumps(data, indent=None, separators=(",", ":")) + "\n")


def check_out_path(path: str | Path, field: str = "out", suffixes: tuple[str, ...] | None = None) -> Path:
    """A file the user asked kvbound to write, checked before any work: its folder exists and is
    writable, it is not a folder or a special file, and it ends in one of `suffixes` (if given).
    A problem is bad input naming the file and `field` (e.g. `--out`)."""
    path = Path(path)
    source = str(path)
    if suffixes and path.suffix.lower() not in suffixes:
        raise InputError(source, field, f"the file name must end in {', '.join(suffixes)}")
    folder = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise InputError(source, field, "is a folder; give a file name")
    if path.exists() and not path.is_file():
        raise InputError(source, field, "is a special file (a device, FIFO or socket); give a regular file")
    if not folder.is_dir():
        raise InputError(source, field, f"folder {str(folder)!r} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise InputError(source, field, f"cannot write here: no write permission in {str(folder)!r}")
    return path


def check_out_folder(path: str | Path, field: str = "out") -> Path:
    """A folder kvbound will create or write into: a folder if it exists, else creatable (its
    nearest existing parent is a writable folder)."""
    path = Path(path)
    source = str(path)
    if path.exists():
        if not path.is_dir():
            raise InputError(source, field, "exists and is not a folder")
        if not os.access(path, os.W_OK | os.X_OK):
            raise InputError(source, field, "cannot write here: no write permission")
        return path
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(source, field, f"cannot create it: {str(parent)!r} is not a writable folder")
    return path


#: largest input file kvbound reads (case files, schedules, traces, profiles): it is read into memory
MAX_INPUT_BYTES = 1 << 30


def check_in_path(path: str | Path, limit: int = MAX_INPUT_BYTES, what: str = "file") -> Path:
    """A file kvbound will read: a regular file (not /dev/zero, a FIFO or a folder) of at most `limit` bytes."""
    path = Path(path)
    source = str(path)
    try:
        st = path.stat()
    except OSError as exc:
        raise InputError(source, "", f"cannot read {what}: {exc.strerror or exc}") from None
    if stat.S_ISDIR(st.st_mode):
        raise InputError(source, "", f"cannot read {what}: is a folder")
    if not stat.S_ISREG(st.st_mode):
        raise InputError(source, "", f"cannot read {what}: not a regular file (a device, FIFO or socket)")
    if st.st_size > limit:
        raise InputError(source, "", f"cannot read {what}: {st.st_size:,} bytes, more than the {limit:,} kvbound reads")
    return path


def read_user_text(path: str | Path, limit: int = MAX_INPUT_BYTES) -> str:
    """A text file the user named, checked by `check_in_path`; unreadable or non-UTF-8 text is bad input."""
    source = str(path)
    check_in_path(path, limit)
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(source, "", f"cannot read file: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise InputError(source, "", f"cannot read file: not UTF-8 text (byte {exc.start}: {exc.reason})") from None


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


@contextlib.contextmanager
def native_stdout_to_stderr():
    """Send what native code (a solver library) writes to file descriptor 1 to 2 meanwhile: `--json`
    keeps stdout for the JSON."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no stdout at all: nothing to protect
        yield
        return
    try:
        os.dup2(2, 1)
        yield
    finally:
        ctypes.CDLL(None).fflush(None)  # the C library's buffered stdout, written while redirected
        os.dup2(saved, 1)
        os.close(saved)
