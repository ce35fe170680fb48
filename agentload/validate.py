"""One way to check settings: dataclasses whose fields say what they accept, and one `--set` parser.

The scenario (run/scenario.py) and the mock's config (mock/config.py) are frozen dataclasses.
`build(cls, raw, At(source, key))` turns a TOML/JSON table into one, checking every field with
a `Check`: given with `setting(default, check)`, or read off the annotation (`bool`, `int`,
`float`, `str`, `Literal[...]`, `X | None`, `dict[str, str]`, `list[str]`, `tuple[str, ...]`,
a nested dataclass). Checks that span fields go in the model's `_validate(self, at)`.
Every failure is one line: `source: dotted.key: expected <what>, got <value>`.

`apply_sets` is the one `--set path=value` parser: the value is a TOML value (else a bare
string), the path is dotted. `relabel` names `--set` as the source of an error whose key
(or a table above it) an override wrote.

A leaf module: it imports nothing of agentload but errors.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import tomllib
import types
import typing
from abc import ABC, abstractmethod
from typing import Any, Iterable, Literal, Mapping, NoReturn

from agentload.errors import ScenarioError

MISSING: Any = object()  # "no value given", distinct from None


def show(value: Any) -> str:
    """What was given, short: 5 (not 5.0), 'abc', [1, 2]."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class At:
    """Where a value sits: its source (a file, `--set`) and dotted key (`stall.after_s`, `urls[0]`)."""

    __slots__ = ("source", "key")

    def __init__(self, source: str, key: str = ""):
        self.source = source
        self.key = key

    def __truediv__(self, name: str | int) -> "At":
        if isinstance(name, int):
            return At(self.source, f"{self.key}[{name}]")
        return At(self.source, f"{self.key}.{name}" if self.key else name)

    def fail(self, expected: str, got: Any = MISSING) -> NoReturn:
        raise ScenarioError(self.source, self.key, f"expected {expected}" + ("" if got is MISSING else f", got {show(got)}"))

    def error(self, text: str) -> NoReturn:
        raise ScenarioError(self.source, self.key, text)


# ---------------------------------------------------------------- checks


class Check(ABC):
    """Takes a raw value, returns the value to store, or fails naming what it expected."""

    expected = "a value"

    @abstractmethod
    def __call__(self, value: Any, at: At) -> Any: ...


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _bounds_text(lo: float, above: bool, hi: float | None, why: str) -> str:
    text = f"{'>' if above else '>='} {lo:g}" + (f" and <= {hi:g}" if hi is not None else "")
    return text + (f" ({why})" if why else "")


class Number(Check):
    """A finite number (never NaN or inf: an infinite timeout is no timeout) within bounds."""

    def __init__(self, lo: float = 0.0, *, above: bool = False, hi: float | None = None, why: str = ""):
        self.lo, self.above, self.hi = lo, above, hi
        self.expected = f"a number {_bounds_text(lo, above, hi, why)}"

    def __call__(self, value: Any, at: At) -> float:
        if not (_is_num(value) and value < math.inf and (value > self.lo if self.above else value >= self.lo)
                and (self.hi is None or value <= self.hi)):
            at.fail(self.expected, value)
        return float(value)


class Whole(Check):
    """An integer within bounds; 5.0 counts as 5 (JSON and TOML may write it so), 5.5 does not."""

    def __init__(self, lo: int = 0, *, hi: int | None = None, why: str = ""):
        self.lo, self.hi = lo, hi
        self.expected = f"a whole number {_bounds_text(lo, False, hi, why)}"

    def __call__(self, value: Any, at: At) -> int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not (isinstance(value, int) and not isinstance(value, bool) and value >= self.lo
                and (self.hi is None or value <= self.hi)):
            at.fail(self.expected, value)
        return value


class Choice(Check):
    def __init__(self, *options: Any):
        self.options = options
        self.expected = "one of " + ", ".join(map(repr, options))

    def __call__(self, value: Any, at: At) -> Any:
        if isinstance(value, bool) or value not in self.options:
            at.fail(self.expected, value)
        return value


class Flag(Check):
    expected = "true or false"

    def __call__(self, value: Any, at: At) -> bool:
        if not isinstance(value, bool):
            at.fail(self.expected, value)
        return value


class Text(Check):
    """A string; `nonblank` refuses "" and spaces, `one_line` refuses CR and LF."""

    def __init__(self, expected: str = "a string", *, nonblank: bool = False, one_line: bool = False):
        self.expected, self.nonblank, self.one_line = expected, nonblank, one_line

    def __call__(self, value: Any, at: At) -> str:
        if (not isinstance(value, str) or (self.nonblank and not value.strip())
                or (self.one_line and ("\r" in value or "\n" in value))):
            at.fail(self.expected, value)
        return value


class Opt(Check):
    """None (left out), or what `check` accepts."""

    def __init__(self, check: Check):
        self.check = check
        self.expected = check.expected

    def __call__(self, value: Any, at: At) -> Any:
        return None if value is None else self.check(value, at)


class Either(Check):
    """The first of `checks` that accepts the value."""

    def __init__(self, *checks: Check, expected: str | None = None):
        self.checks = checks
        self.expected = expected or " or ".join(c.expected for c in checks)

    def __call__(self, value: Any, at: At) -> Any:
        for c in self.checks:
            try:
                return c(value, at)
            except ScenarioError:
                pass
        at.fail(self.expected, value)


class Table(Check):
    """A table: every name checked by `keys`, every value by `values`, each at `key.name`."""

    def __init__(self, values: Check, keys: Check | None = None, expected: str = "a table"):
        self.values, self.keys, self.expected = values, keys, expected

    def __call__(self, value: Any, at: At) -> dict[str, Any]:
        if not isinstance(value, Mapping):
            at.fail(self.expected, value)
        out = {}
        for name, v in value.items():
            if self.keys is not None:
                self.keys(name, at / name)  # the name first: a refused name is not followed by its value
            out[name] = self.values(v, at / name)
        return out


class Items(Check):
    """A list, every item checked by `item` at `key[i]`; `one_ok` takes a lone item as a list of one."""

    def __init__(self, item: Check, *, nonempty: bool = False, one_ok: bool = False, into: type = list,
                 expected: str | None = None):
        self.item, self.nonempty, self.one_ok, self.into = item, nonempty, one_ok, into
        self.expected = expected or ("a non-empty list" if nonempty else "a list")

    def __call__(self, value: Any, at: At) -> Any:
        if self.one_ok and not isinstance(value, (list, tuple)):
            value = [value]
        if not isinstance(value, (list, tuple)) or (self.nonempty and not value):
            at.fail(self.expected, value)
        return self.into(self.item(v, at / i) for i, v in enumerate(value))


class Model(Check):
    """A table that becomes the dataclass `cls` (see `build`)."""

    def __init__(self, cls: type, expected: str = "a table"):
        self.cls, self.expected = cls, expected

    def __call__(self, value: Any, at: At) -> Any:
        return build(self.cls, value, at, expected=self.expected)


# ---------------------------------------------------------------- models


def setting(default: Any = MISSING, check: Check | None = None, *, internal: bool = False) -> Any:
    """A dataclass field with its check (None: read it off the annotation); no default: required.

    `internal` fields are not read from the table (`build` gets them as keyword arguments)."""
    kw: dict[str, Any] = {"metadata": {"check": check, "internal": internal}}
    if isinstance(default, (list, dict, set)):
        kw["default_factory"] = functools.partial(type(default), default)
    elif default is not MISSING:
        kw["default"] = default
    return dataclasses.field(**kw)


def _infer(typ: Any) -> Check:
    origin, args = typing.get_origin(typ), typing.get_args(typ)
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            return Opt(_infer(rest[0]))
    if origin is Literal:
        return Choice(*args)
    if origin is dict and args == (str, str):
        return Table(Text(), expected="a table of strings")
    if origin is list and args == (str,):
        return Items(Text(), expected="a list of strings")
    if origin is tuple and args == (str, ...):
        return Items(Text(), into=tuple, expected="a list of strings")
    simple = {bool: Flag, int: Whole, float: Number, str: Text}
    if typ in simple:
        return simple[typ]()
    if isinstance(typ, type) and dataclasses.is_dataclass(typ):
        return Model(typ)
    raise TypeError(f"no check for {typ!r}: give one with setting(default, check)")


@functools.cache
def checks_of(cls: type) -> dict[str, tuple[Check, bool]]:
    """Field name -> (check, required), in field order, for the fields read from a table."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        if f.metadata.get("internal"):
            continue
        check = f.metadata.get("check") or _infer(hints[f.name])
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        out[f.name] = (check, required)
    return out


def build(cls: type, raw: Any, at: At, *, expected: str = "a table", **internal: Any) -> Any:
    """The dataclass `cls` from the table `raw` (an instance of `cls` passes as it is).

    Unknown keys, missing required ones and refused values fail at their dotted key; then the
    model's own `_validate(at)`, if it has one, checks what spans fields."""
    if isinstance(raw, cls):
        return raw
    if not isinstance(raw, Mapping):
        at.fail(expected, raw)
    fields = checks_of(cls)
    kw: dict[str, Any] = {}
    for name, value in raw.items():
        if name not in fields:
            (at / name).error(unknown(name, list(fields), "section" if not at.key else "key"))
        kw[name] = fields[name][0](value, at / name)
    for name, (check, required) in fields.items():
        if required and name not in kw:
            (at / name).error(f"missing; expected {check.expected}")
    obj = cls(**kw, **internal)
    hook = getattr(obj, "_validate", None)
    if hook is not None:
        hook(at)
    return obj


def unknown(name: str, names: list[str], what: str = "key") -> str:
    import difflib  # only on this error path: the mock subprocess starts without it

    near = difflib.get_close_matches(str(name), names, n=1, cutoff=0.6)
    hint = f" (did you mean {near[0]}?)" if near else ""
    return f"unknown {what}{hint}; expected one of: {', '.join(names)}"


# ---------------------------------------------------------------- --set path=value


def parse_value(text: str) -> Any:
    """A `--set` value: a TOML value (number, bool, string, array, inline table); else a bare string."""
    try:
        parsed = tomllib.loads(f"v = {text}")
    except tomllib.TOMLDecodeError:
        return text
    # "1\nx = 2" parses into two keys: that is not one value
    return parsed["v"] if len(parsed) == 1 else text


def apply_sets(raw: dict[str, Any], items: Iterable[str], *, form: str, under: str | None = None,
               depth: int = 1, source: str = "--set", whole: tuple[str, ...] = ()) -> list[str]:
    """Apply `dotted.path=value` items onto `raw` in place; return the dotted paths written
    (with the tables made on the way).

    `under` is a table every path is inside (its name as a first part is optional: the mock's
    `hang_s=5` is `mock.hang_s=5`); `depth` is the fewest parts a path has (`section.key`: 2).
    A table on the way is made where there is none; a value that is not a table stops it. A list
    on the way is indexed by a number (`schedule.0.at_s=30`); names in `whole` may be set with
    fewer parts (`schedule=[...]`, a list of tables)."""
    written = []
    for item in items:
        path, sep, text = item.partition("=")
        parts = [p.strip() for p in path.split(".")]
        if under is not None and parts[0] != under:
            parts.insert(0, under)
        short = len(parts) - (under is not None) < depth and not (len(parts) == 1 and parts[0] in whole)
        if not sep or not all(parts) or short:
            raise ScenarioError(source, (path.strip() if sep else "") or item.strip(), f"expected {form}")
        node: dict[str, Any] | list[Any] = raw
        for i, p in enumerate(parts):
            last = i == len(parts) - 1
            if isinstance(node, list):
                if not p.isdigit() or int(p) >= len(node):
                    raise ScenarioError(source, ".".join(parts), f"expected an index below {len(node)} "
                                                                  f"for {'.'.join(parts[:i])}, got {p}")
                if last:
                    node[int(p)] = parse_value(text.strip())
                    break
                nxt = node[int(p)]
            else:
                if last:
                    node[p] = parse_value(text.strip())
                    break
                nxt = node.get(p)
                if nxt is None:
                    nxt = node[p] = {}
                    written.append(".".join(parts[:i + 1]))  # a table made here: whatever it lacks is the item's
            if not isinstance(nxt, (dict, list)):
                raise ScenarioError(source, ".".join(parts), f"expected {'.'.join(parts[:i + 1])} to be a table, "
                                                              f"got {show(nxt)}")
            node = nxt
        written.append(".".join(parts))
    return written


def relabel(err: ScenarioError, written: list[str], label: str = "--set") -> ScenarioError:
    """`err` with `label` as its source when an override wrote its key or a table above it
    (see `apply_sets`); else `err` itself."""
    if any(err.key == p or err.key.startswith((p + ".", p + "[")) for p in written):
        return ScenarioError(label, err.key, err.expected)
    return err
