"""Typed JSON records (pure): dataclasses read from and written to JSON by their type hints,
with the JSON Schema of what they accept.

A :class:`Record` is a dataclass whose fields are JSON values (``bool``, ``int``, ``float``,
``str``, ``None``), lists and string-keyed dicts of them, other records, or ``Any``. Reading
checks every value's type and names the field of the first that is wrong
(``collectives[3].time_us``); keys a record does not declare are kept, in order, in its
``extra`` and written back, so a document from a newer fabriclab reads and round-trips. A
field whose metadata says ``omit`` is left out of the JSON while it is None (sections a run
writes only when it has them); a field the JSON did not have reads as its default and stays
out of the JSON written back while it keeps that default (a document round-trips as it was).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, ClassVar, TypeVar, Union, get_args, get_origin

R = TypeVar("R", bound="Record")

#: field metadata: leave the key out of the JSON while the value is None
OMIT = {"omit": True}


class DocumentError(ValueError):
    """A value of the wrong type in a document: ``field`` is its path (``fabric.mtu``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field or 'document'}: {message}")
        self.field = field
        self.message = message


def optional(default=None):
    """A field left out of the JSON while it is None."""
    return dataclasses.field(default=default, metadata=OMIT)


@dataclasses.dataclass
class Record:
    """A dataclass read from and written to JSON by its fields' types."""

    #: what the record is, for its JSON Schema's description
    TITLE: ClassVar[str] = ""

    @classmethod
    def from_json(cls: type[R], data: Any, where: str = "") -> R:
        """The record of ``data`` (a dict as JSON gives it).

        Raises:
            DocumentError: a missing required field or a value of the wrong type.
        """
        if not isinstance(data, dict):
            raise DocumentError(where, f"expected an object, got {_kind(data)}")
        hints = _hints(cls)
        values, extra = {}, {}
        for key, value in data.items():
            if key in hints and key != "extra":
                values[key] = _read(hints[key], value, _join(where, key))
            else:
                extra[key] = value
        for f in dataclasses.fields(cls):
            if f.name not in values and f.name != "extra" and _required(f):
                raise DocumentError(_join(where, f.name), "missing")
        record = cls(**values, **({"extra": extra} if "extra" in hints else {}))
        # what the JSON did not have stays out of it while it keeps its default
        record._absent = frozenset(f.name for f in dataclasses.fields(cls)
                                   if f.name not in data and f.name != "extra")
        return record

    def to_json(self) -> dict:
        """The record as JSON values, declared fields first, then what ``extra`` kept."""
        out: dict[str, Any] = {}
        absent = getattr(self, "_absent", frozenset())
        for f in dataclasses.fields(self):
            if f.name == "extra":
                continue
            value = getattr(self, f.name)
            if value is None and f.metadata.get("omit"):
                continue
            if f.name in absent and value == _default(f):
                continue
            out[f.name] = _write(value)
        out.update(getattr(self, "extra", None) or {})
        return out

    @classmethod
    def json_schema(cls) -> dict:
        """The JSON Schema (draft 2020-12) of what :meth:`from_json` accepts; records it
        refers to are in ``$defs``."""
        defs: dict[str, dict] = {}
        root = _record_schema(cls, defs)
        return {"$schema": "https://json-schema.org/draft/2020-12/schema", **root,
                "$defs": dict(sorted(defs.items()))}


def _hints(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _required(f: dataclasses.Field) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _join(where: str, key: Any) -> str:
    return f"{where}[{key}]" if isinstance(key, int) else f"{where}.{key}" if where else str(key)


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            type(None): "null"}.get(type(value), "a number")


def _is_record(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, Record)


def _union_args(tp: Any) -> tuple | None:
    if get_origin(tp) in (Union, types.UnionType):
        return get_args(tp)
    return None


def _read(tp: Any, value: Any, where: str) -> Any:
    if tp is Any:
        return value
    options = _union_args(tp)
    if options is not None:
        if value is None and type(None) in options:
            return None
        kinds = [o for o in options if o is not type(None)]
        if len(kinds) == 1:
            return _read(kinds[0], value, where)
        problems = []
        for option in kinds:
            try:
                return _read(option, value, where)
            except DocumentError as e:
                problems.append(e.message)
        raise DocumentError(where, " or ".join(problems))
    if _is_record(tp):
        return tp.from_json(value, where)
    origin = get_origin(tp)
    if origin is list:
        if not isinstance(value, list):
            raise DocumentError(where, f"expected a list, got {_kind(value)}")
        (item,) = get_args(tp) or (Any,)
        return [_read(item, v, _join(where, i)) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise DocumentError(where, f"expected an object, got {_kind(value)}")
        _, item = get_args(tp) or (str, Any)
        return {k: _read(item, v, _join(where, k)) for k, v in value.items()}
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value
        raise DocumentError(where, f"expected a number, got {_kind(value)}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise DocumentError(where, f"expected an integer, got {_kind(value)}")
    if tp in (str, bool):
        if isinstance(value, tp):
            return value
        raise DocumentError(where, f"expected {'a string' if tp is str else 'a boolean'}, "
                                   f"got {_kind(value)}")
    if tp is dict or tp is list:
        if isinstance(value, tp):
            return value
        raise DocumentError(where, f"expected {_kind(tp())}, got {_kind(value)}")
    raise TypeError(f"{where}: no JSON reading for {tp!r}")


def _write(value: Any) -> Any:
    if isinstance(value, Record):
        return value.to_json()
    if isinstance(value, list):
        return [_write(v) for v in value]
    if isinstance(value, dict):
        return {k: _write(v) for k, v in value.items()}
    return value


def _schema(tp: Any, defs: dict[str, dict]) -> dict:
    if tp is Any:
        return {}
    options = _union_args(tp)
    if options is not None:
        return {"anyOf": [_schema(o, defs) for o in options]}
    if _is_record(tp):
        if tp.__name__ not in defs:
            defs[tp.__name__] = {}  # recursion guard
            defs[tp.__name__] = _record_schema(tp, defs)
        return {"$ref": f"#/$defs/{tp.__name__}"}
    origin = get_origin(tp)
    if origin is list or tp is list:
        (item,) = get_args(tp) or (Any,)
        return {"type": "array", "items": _schema(item, defs)} if item is not Any else {
            "type": "array"}
    if origin is dict or tp is dict:
        _, item = get_args(tp) or (str, Any)
        return {"type": "object", **({"additionalProperties": _schema(item, defs)}
                                     if item is not Any else {})}
    simple = {float: "number", int: "integer", str: "string", bool: "boolean",
              type(None): "null"}
    if tp in simple:
        return {"type": simple[tp]}
    raise TypeError(f"no JSON Schema for {tp!r}")


def _record_schema(cls, defs: dict[str, dict]) -> dict:
    hints = _hints(cls)
    props, required = {}, []
    for f in dataclasses.fields(cls):
        if f.name == "extra":
            continue
        props[f.name] = _schema(hints[f.name], defs)
        doc = (f.metadata or {}).get("doc")
        if doc:
            props[f.name]["description"] = doc
        if _required(f):
            required.append(f.name)
    out: dict[str, Any] = {"type": "object"}
    if cls.TITLE:
        out["description"] = cls.TITLE
    out["properties"] = props
    if required:
        out["required"] = required
    return out
