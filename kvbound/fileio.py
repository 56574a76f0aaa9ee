"""Files and streams: the one atomic file writer (write beside the target, flush to disk, rename),
the checks of user paths, and native code's stdout kept off kvbound's own.

Readers never see half a file, and a failed write leaves neither the target changed nor a
temporary file behind.
"""
from __future__ import annotations

import contextlib
import ctypes
import io
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


class _GuardedStdout:
    """sys.stdout as a command sees it: text its encoding cannot show is written with backslash escapes
    (`caf\\xe9`) rather than ending the command, and a failed write (a full disk, `> /dev/full`) is bad
    input naming stdout (one error line, exit status 2) rather than a traceback. A closed pipe
    (`| head`) still raises BrokenPipeError."""

    def __init__(self, stream):
        self._stream = stream

    def _guard(self, call, *args):
        try:
            return call(*args)
        except BrokenPipeError:
            raise
        except OSError as exc:
            self._discard()
            raise InputError("stdout", "", f"cannot write: {exc.strerror or exc}") from None

    def _discard(self) -> None:
        """After a failed write: what is still buffered goes nowhere, so that the interpreter's own flush
        at exit does not fail again."""
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
            pass

    def write(self, text: str) -> int:
        try:
            return self._guard(self._stream.write, text)
        except UnicodeEncodeError:
            encoding = getattr(self._stream, "encoding", None) or "utf-8"
            return self._guard(self._stream.write, text.encode(encoding, "backslashreplace").decode(encoding))

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self._guard(self._stream.flush)

    def __getattr__(self, name):
        return getattr(self._stream, name)


@contextlib.contextmanager
def guarded_stdout():
    """Meanwhile, sys.stdout is a `_GuardedStdout` over the real one (restored after)."""
    real = sys.stdout
    if real is None or isinstance(real, _GuardedStdout):
        yield
        return
    sys.stdout = _GuardedStdout(real)
    try:
        yield
    finally:
        if isinstance(sys.stdout, _GuardedStdout):
            sys.stdout = real


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


def same_file(a: str | Path, b: str | Path) -> bool:
    """Whether `a` and `b` name the same file: the same inode (hard links, symbolic links) when both
    exist, else the same path once links and `..` are resolved (an output not yet written)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def check_paths(inputs, outputs, folders=()) -> None:
    """The files of one command, checked before it starts work: each output (`(field, path, suffixes)`,
    e.g. `("--out", "s.json", (".json",))`) is not empty, is not one of the `inputs` (`(what, path)`,
    e.g. `("case", "c.toml")`) nor another output, and passes `check_out_path`; each of `folders`
    (`(field, path)`) passes `check_out_folder`. A problem is bad input naming the file and the field
    (`error: FILE: FIELD: problem`, exit status 2); nothing has been read or written yet."""
    outputs = [(field, path, suffixes) for field, path, suffixes in outputs if path is not None]
    folders = [(field, path) for field, path in folders if path is not None]
    for field, path in [(f, p) for f, p, _ in outputs]:
        if not str(path).strip():
            raise InputError("", field, "is empty; give a file name")
    for field, path in folders:
        if not str(path).strip():
            raise InputError("", field, "is empty; give a folder name")
    for k, (field, path, _) in enumerate(outputs):
        for what, source in inputs:
            if source is not None and str(source).strip() and same_file(path, source):
                shown = "" if str(source) == str(path) else f" ({source})"
                raise InputError(str(path), field, f"is the {what}{shown}, an input of this command: writing "
                                                   "it would destroy the input; give another file name")
        for other, other_path, _ in outputs[:k]:
            if same_file(path, other_path):
                raise InputError(str(path), field, f"is also {other}: give each output its own file name")
    for field, path, suffixes in outputs:
        check_out_path(path, field, suffixes)
    for field, path in folders:
        check_out_folder(path, field)


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
    """A text file the user named, checked by `check_in_path`; unreadable or non-UTF-8 text is bad input.
    A leading UTF-8 byte-order mark (as some editors write) is dropped."""
    source = str(path)
    check_in_path(path, limit)
    try:
        return Path(path).read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise InputError(source, "", f"cannot read file: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise InputError(source, "", f"cannot read file: not UTF-8 text (byte {exc.start}: {exc.reason})") from None


#: how deeply the lists and tables (objects) of a file kvbound reads may nest: a schedule needs 4 levels,
#: a case or sweep spec 4 (a TOML key `a.b.c` is 3 levels); deeper input is refused before it is used
MAX_NESTING = 64


_CONTAINERS = (list, dict)
_SCALARS = frozenset({int, float, str, bool, type(None)})


def nesting_problem(data, limit: int = MAX_NESTING) -> str | None:
    """Why `data` (parsed JSON or TOML) nests too deeply, or None. Level by level, without recursion:
    any depth is safe to check."""
    level = [data] if isinstance(data, _CONTAINERS) else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return f"lists or tables nested more than {limit} levels deep"
        below = []
        for value in level:
            items = value.values() if isinstance(value, dict) else value
            if not set(map(type, items)) <= _SCALARS:  # most hold only numbers and strings: no loop in Python
                below.extend(item for item in items if isinstance(item, _CONTAINERS))
        level = below
    return None


class JsonObject(dict):
    """A JSON object that repeated a key: `repeated` lists the repeated keys (json keeps the last value)."""

    repeated: tuple[str, ...] = ()


def _json_object(pairs):
    obj = dict(pairs)
    if len(obj) == len(pairs):
        return obj
    seen, repeated = set(), []
    for key, _ in pairs:
        if key in seen and key not in repeated:
            repeated.append(key)
        seen.add(key)
    out = JsonObject(obj)
    out.repeated = tuple(repeated)
    return out


def repeated_keys(source: str, where: str, obj, what: str = "key") -> None:
    """Bad input if the JSON object `obj` (read by `read_user_json`) gave a key twice."""
    repeated = getattr(obj, "repeated", ())
    if repeated:
        keys = ", ".join(f"{k!r}" for k in repeated)
        raise InputError(source, where, f"{what} {keys} given more than once (each may appear once)")


def read_user_json(path: str | Path, limit: int = MAX_INPUT_BYTES):
    """A JSON file the user named (`read_user_text`): malformed JSON, or lists and objects nested more than
    `MAX_NESTING` levels, is bad input naming the file. An object that repeats a key is a `JsonObject`
    whose `repeated` names the keys (`repeated_keys` refuses it where the reader looks)."""
    source = str(path)
    text = read_user_text(path, limit)
    try:
        data = json.loads(text, object_pairs_hook=_json_object)
    except json.JSONDecodeError as exc:
        raise InputError(source, "", f"malformed JSON: {exc}") from None
    except RecursionError:
        raise InputError(source, "", f"malformed JSON: lists or objects nested more than {MAX_NESTING} "
                                     "levels deep") from None
    problem = nesting_problem(data)
    if problem:
        raise InputError(source, "", f"malformed JSON: {problem}")
    return data


def write_json_atomic(path: str | Path, data) -> Path:
    """Compact JSON plus a newline, atomically."""
    return write_atomic(path, json.dumps(data, indent=None, separators=(",", ":")) + "\n")


def save_figure_atomic(fig, path: str | Path, **savefig_kwargs) -> Path:
    """A matplotlib figure in the format its suffix names, atomically."""
    path = Path(path)
    buffer = io.BytesIO()
    fmt = path.suffix.lstrip(".").lower() or None
    fig.savefig(buffer, format=fmt, **savefig_kwargs)
    return write_user_file(path, buffer.getvalue())  # a full disk is one error line, not a traceback


@contextlib.contextmanager
def native_stdout_aside(verbose: bool = False):
    """Meanwhile, what native code (a solver library: its banner, its log) writes to file descriptor 1
    goes to stderr with `verbose`, else nowhere: stdout is kvbound's own (`--json` keeps it for the JSON)."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no stdout at all: nothing to protect
        yield
        return
    target = 2 if verbose else os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(target, 1)
        yield
    finally:
        ctypes.CDLL(None).fflush(None)  # the C library's buffered stdout, written while redirected
        os.dup2(saved, 1)
        os.close(saved)
        if target != 2:
            os.close(target)
