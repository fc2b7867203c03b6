"""Typed settings as plain data and back (pure): what a cluster's coordinator sends a machine
instead of Python objects. :func:`to_plain` turns a dataclass tree (enums, tuples, nested
specs) into JSON values; :func:`from_plain` rebuilds it, checking every value against the
field's declared type and naming the first one that does not fit, so that nothing but a
well-formed setting is ever built from what arrives."""

from __future__ import annotations

import dataclasses
import enum
import json
import types
import typing

from testbed.errors import ConfigError, shown

#: the deepest a plain document may nest (a spec is a few levels deep)
MOST_DEPTH = 32


def to_plain(value: object) -> object:
    """``value`` as JSON values: dataclasses as mappings of their fields, enums as their
    values, tuples and sets as lists."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
        return [to_plain(v) for v in items]
    if isinstance(value, dict):
        return {str(k): to_plain(v) for k, v in value.items()}
    return value


def from_plain(cls: type, data: object, path: str = "") -> object:
    """The ``cls`` instance ``data`` describes (as :func:`to_plain` made it).

    Raises:
        ConfigError: naming the field path whose value does not fit its type, or a field
            missing, unknown or nested too deep.
    """
    json.dumps(data, allow_nan=False)  # plain JSON values only (TypeError/ValueError else)
    return _value(cls, data, path or cls.__name__, 0)


def _value(tp: object, data: object, path: str, depth: int) -> object:
    if depth > MOST_DEPTH:
        raise ConfigError(path, f"nested deeper than {MOST_DEPTH} levels")
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is typing.Any:
        return data
    if origin in (typing.Union, types.UnionType):
        for option in args:
            try:
                return _value(option, data, path, depth)
            except ConfigError:
                continue
        raise ConfigError(path, f"{shown(data)} fits none of {tp}")
    if tp is type(None):
        if data is not None:
            raise ConfigError(path, f"must be null, got {shown(data)}")
        return None
    if dataclasses.is_dataclass(tp):
        return _dataclass(tp, data, path, depth)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(data)
        except ValueError:
            raise ConfigError(path, f"{shown(data)} is not one of "
                                    f"{[m.value for m in tp]}") from None
    if origin in (tuple, list, frozenset, set) or tp in (tuple, list):
        return _sequence(tp, origin or tp, args, data, path, depth)
    if origin is dict or tp is dict:
        if not isinstance(data, dict):
            raise ConfigError(path, f"must be a mapping, got {shown(data)}")
        key_t, value_t = args or (str, typing.Any)
        return {_value(key_t, _key(key_t, k), f"{path}.{k}", depth + 1):
                _value(value_t, v, f"{path}.{k}", depth + 1) for k, v in data.items()}
    return _scalar(tp, data, path)


def _key(tp: object, key: str) -> object:
    """A mapping's key as JSON wrote it (a string) in its declared type (an int's digits)."""
    if tp is int and isinstance(key, str) and key.lstrip("-").isdigit() and len(key) < 20:
        return int(key)
    return key


def _scalar(tp: object, data: object, path: str) -> object:
    if tp is float and isinstance(data, int) and not isinstance(data, bool):
        return float(data)
    if tp in (int, float) and isinstance(data, bool):
        raise ConfigError(path, f"must be a number, got {shown(data)}")
    if isinstance(tp, type) and isinstance(data, tp):
        return data
    raise ConfigError(path, f"must be {getattr(tp, '__name__', tp)}, got {shown(data)}")


def _sequence(tp, origin, args, data, path: str, depth: int) -> object:
    if not isinstance(data, list):
        raise ConfigError(path, f"must be a list, got {shown(data)}")
    if origin is tuple and args and args[-1] is not Ellipsis:
        if len(args) != len(data):
            raise ConfigError(path, f"must have {len(args)} items, got {len(data)}")
        items = [_value(a, v, f"{path}[{i}]", depth + 1)
                 for i, (a, v) in enumerate(zip(args, data))]
    else:
        item_t = args[0] if args else typing.Any
        items = [_value(item_t, v, f"{path}[{i}]", depth + 1) for i, v in enumerate(data)]
    return origin(items) if origin in (tuple, frozenset, set) else items


def _dataclass(cls: type, data: object, path: str, depth: int) -> object:
    if not isinstance(data, dict):
        raise ConfigError(path, f"must be a mapping, got {shown(data)}")
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ConfigError(f"{path}.{unknown[0]}", "no such field")
    values = {}
    for name, f in known.items():
        if name in data:
            values[name] = _value(hints[name], data[name], f"{path}.{name}", depth + 1)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{path}.{name}", "missing")
    try:
        return cls(**values)
    except (TypeError, ValueError) as err:
        raise ConfigError(path, str(err)) from None
