"""The experiment file's JSON Schema (pure): the schema itself, and a document checked
against it with every problem described by its field path (``fabric.k: must be >= 2, got 0``),
close misspellings of a key or a choice named (``did you mean 'rate_mbps'?``)."""

from __future__ import annotations

import difflib
import json
from functools import cache
from importlib import resources

import jsonschema

from testbed.errors import ConfigError, shown


@cache
def schema() -> dict:
    """The experiment file's JSON Schema (``fabriclab/schema/experiment.schema.json``)."""
    text = resources.files("fabriclab").joinpath("schema/experiment.schema.json").read_text()
    return json.loads(text)


def check_entry(entry: dict, where: str) -> None:
    """Check one workload entry (a replayed trace line) as the schema checks ``collectives``."""
    check(entry, schema()["$defs"]["workload"]["properties"]["collectives"]["items"], where)


def check(data: object, sub_schema: dict, prefix: str = "") -> None:
    validator = jsonschema.Draft202012Validator(sub_schema)
    problems = sorted((describe(e, prefix) for e in validator.iter_errors(data)),
                      key=lambda p: p[0])
    if problems:
        first_path, first_msg = problems[0]
        more = "".join(f"\n  {p}: {m}" if p else f"\n  {m}" for p, m in problems[1:])
        raise ConfigError(first_path, first_msg + more, problems)


def _did_you_mean(given: object, choices: list[str]) -> str:
    """`` (did you mean 'ecmp'?)`` when a string given is close to one of ``choices``."""
    if not isinstance(given, str) or not given:
        return ""
    close = difflib.get_close_matches(given[:100], choices, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def describe(error: jsonschema.ValidationError, prefix: str = "") -> tuple[str, str]:
    path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}"
                   for p in error.absolute_path)
    path = (prefix + path) if prefix else path.lstrip(".")
    kind = error.validator
    if kind in ("oneOf", "anyOf") and error.context:
        # the alternative the value was meant for: one it went into (an error inside it: a
        # mapping's field), else one of its type, if any is
        fitting = ([e for e in error.context if e.relative_path]
                   or [e for e in error.context if e.validator != "type"] or list(error.context))
        return describe(jsonschema.exceptions.best_match(fitting), prefix)
    if kind == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        extra = sorted(set(error.instance) - set(allowed), key=str)
        key = ".".join(filter(None, [path, str(extra[0]) if extra else ""]))
        return key, f"unknown key{_did_you_mean(extra[0] if extra else '', allowed)} " \
                    f"(allowed: {', '.join(allowed)})"
    if kind == "required":
        missing = error.message.split("'")[1] if "'" in error.message else "?"
        return ".".join(filter(None, [path, missing])), "required"
    if kind == "type":
        return path, f"must be of type {error.validator_value}, got {shown(error.instance)}"
    if kind == "enum":
        choices = [str(v) for v in error.validator_value]
        return path, (f"must be one of {', '.join(choices)}, got {shown(error.instance)}"
                      f"{_did_you_mean(error.instance, choices)}")
    if kind == "const":
        return path, f"must be {error.validator_value!r}, got {shown(error.instance)}"
    if kind in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
        op = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<=",
              "exclusiveMaximum": "<"}[kind]
        return path, f"must be {op} {error.validator_value}, got {shown(error.instance)}"
    return path, error.message
