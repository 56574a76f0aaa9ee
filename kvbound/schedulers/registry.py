"""How a scheduler is described in the table (`kvbound.schedulers`) and built from a spec `name:key=value,...`.

An entry's options are typed by annotations, so each is declared once, where it is used: a
unified preset's are the fields of `UnifiedParams` (defaults: the preset's values), the aliases it
names, and the constructor arguments it names; any other policy's are the constructor arguments
it names.
"""
from __future__ import annotations

import difflib
import inspect
import math
import typing
from dataclasses import dataclass, fields, replace

from ..errors import InputError
from ..workload import MAX_INT
from .base import Policy
from .unified import UnifiedParams, UnifiedScheduler

_FIELD_TYPES = typing.get_type_hints(UnifiedParams)
_FIELDS = [f.name for f in fields(UnifiedParams)]


@dataclass(frozen=True)
class Option:
    """A key a spec may set: the type of its value (bool, int, float or str), its default, whether
    it also takes "none" (None), and the argument or field it sets (not the key for an alias)."""
    kind: type
    default: object
    optional: bool
    target: str


@dataclass(frozen=True)
class Scheduler:
    """One row of the table: a policy class, built with `params` if it is a unified preset."""
    name: str
    description: str
    cls: type[Policy]
    params: UnifiedParams | None
    options: dict[str, Option]

    def build(self, label: str, values: dict) -> Policy:
        """The policy named `label`, with parsed option values by key; ValueError if they are out of range."""
        args = {self.options[key].target: value for key, value in values.items()}
        if self.params is None:  # the class's own `name` would hide the options a label shows
            built = self.cls(**args)
            built.name = label
            return built
        params = replace(self.params, **{k: v for k, v in args.items() if k in _FIELD_TYPES})
        return self.cls(label, params, **{k: v for k, v in args.items() if k not in _FIELD_TYPES})


def _option(annotation, default, target: str) -> Option:
    """An option typed by its annotation: bool, int, float or str, or one of them | None."""
    args = typing.get_args(annotation)
    optional = type(None) in args
    kind = next(a for a in args if a is not type(None)) if optional else annotation
    if kind not in (bool, int, float, str) or (optional and len(args) != 2):
        raise TypeError(f"option {target}: type {annotation} is not bool, int, float or str (or one of them | None)")
    return Option(kind, default, optional, target)


def _init_options(cls: type, names: tuple[str, ...]) -> dict[str, Option]:
    arguments = inspect.signature(cls, eval_str=True).parameters
    return {name: _option(arguments[name].annotation, arguments[name].default, name) for name in names}


def preset(name: str, params: UnifiedParams, description: str, cls: type[UnifiedScheduler] = UnifiedScheduler,
           options: tuple[str, ...] = (), aliases: dict[str, str] | None = None) -> Scheduler:
    """A unified preset: `cls(label, params, **constructor options)`; its options are every field of
    `UnifiedParams`, `aliases` (key -> field) and the constructor arguments named in `options`."""
    opts = {f: _option(_FIELD_TYPES[f], getattr(params, f), f) for f in _FIELDS}
    opts.update({key: opts[field] for key, field in (aliases or {}).items()})
    opts.update(_init_options(cls, options))
    return Scheduler(name, description, cls, params, opts)


def policy(name: str, cls: type[Policy], description: str, options: tuple[str, ...] = ()) -> Scheduler:
    """Any other policy: `cls(**options)`, its options the constructor arguments named in `options`."""
    return Scheduler(name, description, cls, None, _init_options(cls, options))


#: the policies of their own modules, in the order their modules register them (`kvbound.schedulers`'
#: import line of those modules)
POLICIES: list[Scheduler] = []


def register(entry: Scheduler) -> Scheduler:
    """Add a policy module's entry to the registry (at its import)."""
    POLICIES.append(entry)
    return entry


def table(*entries: Scheduler) -> dict[str, Scheduler]:
    """The registry: entries by name, in the given order."""
    registry = {entry.name: entry for entry in entries}
    if len(registry) != len(entries):
        raise ValueError("two schedulers share a name")
    return registry


def _bad_option(where: str, problem: str) -> InputError:
    """A bad scheduler name or option: named by the field `scheduler` (the CLI shows its flag)."""
    return InputError("", "scheduler", f"{where}: {problem}")


def _parse_value(spec: str, key: str, text: str, option: Option):
    kind, lower = option.kind, text.lower()
    if option.optional and lower == "none":
        return None
    if kind is bool:
        if lower in ("true", "1", "yes", "on"):
            return True
        if lower in ("false", "0", "no", "off"):
            return False
        raise _bad_option(f"{spec}: {key}", f"expected true or false, got {text!r}")
    if kind is int:
        try:
            value = float(text) if any(ch in lower for ch in ".e") else int(text)
        except ValueError:
            raise _bad_option(f"{spec}: {key}", f"expected an integer, got {text!r}") from None
        if not (math.isfinite(value) and value == int(value) and abs(value) <= MAX_INT):
            raise _bad_option(f"{spec}: {key}", f"expected an integer below 2^53, got {text!r}")
        return int(value)
    if kind is float:
        try:
            value = float(text)
        except ValueError:
            raise _bad_option(f"{spec}: {key}", f"expected a number, got {text!r}") from None
        if not math.isfinite(value):
            raise _bad_option(f"{spec}: {key}", f"expected a finite number, got {text!r}")
        return value
    return text


def build(registry: dict[str, Scheduler], spec: str) -> Policy:
    """A fresh policy from `name` or `name:key=value,...`; named `spec` if it sets options, else `name`."""
    name, _, text = spec.partition(":")
    overrides = {}
    if text:
        for part in text.split(","):
            key, eq, value = part.partition("=")
            if not eq:
                raise _bad_option(spec, f"option {part!r} is not key=value")
            if key.strip() in overrides:
                raise _bad_option(spec, f"option {key.strip()} given more than once")
            overrides[key.strip()] = value.strip()
    entry = registry.get(name)
    if entry is None:
        hint = difflib.get_close_matches(name, list(registry), n=1)
        raise _bad_option(name, "unknown scheduler" + (f" (did you mean '{hint[0]}'?)" if hint else "")
                          + "; `kvbound schedulers` lists them")
    if overrides and not entry.options:
        raise _bad_option(spec, f"{name} takes no options")
    values, targets = {}, {}
    for key, value in overrides.items():
        if key not in entry.options:
            raise _bad_option(f"{spec}: {key}", f"unknown option; allowed: {', '.join(sorted(entry.options))}")
        target = entry.options[key].target
        if target in targets:  # an alias and the option it names
            raise _bad_option(spec, f"{targets[target]} and {key} set the same option; give one")
        targets[target] = key
        values[key] = _parse_value(spec, key, value, entry.options[key])
    try:
        return entry.build(spec if overrides else name, values)
    except ValueError as exc:
        raise _bad_option(spec, str(exc)) from None

