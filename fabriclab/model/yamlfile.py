"""An experiment file's text as data (pure): a regular file of bounded size, YAML's safe subset
made stricter (no aliases or anchors, no key given twice, bounded nesting, no number of
thousands of digits), every refusal a :class:`ConfigError` naming the file and the place."""

from __future__ import annotations

from pathlib import Path

import yaml

from testbed.errors import ConfigError
from traffic.workloads.workload import read_regular


def read(path: Path) -> object:
    """The data of the YAML file at ``path``.

    Raises:
        ConfigError: naming the file: not a readable regular file of at most
            :data:`MOST_FILE_BYTES`, not UTF-8, not valid YAML, or refused by
            :class:`StrictLoader`.
    """
    try:
        text = read_regular(str(path), str(path), MOST_FILE_BYTES,
                            limit_note="an experiment file may have").decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(str(path), f"not a text file: byte {err.start} is not UTF-8; an "
                                     "experiment file is YAML text") from None
    try:
        return yaml.load(text, Loader=StrictLoader)  # noqa: S506 - a SafeLoader, made stricter
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(str(path), f"not valid YAML{where}: {getattr(err, 'problem', err)}") from None
    except ValueError as err:  # a number YAML reads but Python will not hold (5,000 digits)
        raise ConfigError(str(path), f"not a usable YAML number: {err}") from None


MOST_FILE_BYTES = 4 << 20  # an experiment file's most (traces and logs are files of their own)
MOST_DEPTH = 64  # the deepest an experiment file's mappings and lists nest
MAX_NUMBER_CHARS = 64  # the longest plain scalar read as a number (or boolean, or null)


class StrictLoader(yaml.SafeLoader):
    """YAML's safe subset, stricter: a key given twice in one mapping is an error (PyYAML keeps
    the last silently), and anchors and aliases are refused (a few hundred bytes of nested
    aliases expand to billions of nodes for whatever walks the data)."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, f"aliases (*{event.anchor}) are not supported in an experiment file: "
                "write the value out", event.start_mark)
        event = self.peek_event()
        if getattr(event, "anchor", None) is not None:
            raise yaml.composer.ComposerError(
                None, None, f"anchors (&{event.anchor}) are not supported in an experiment "
                "file: write the value out", event.start_mark)
        depth = getattr(self, "_depth", 0)
        if depth >= MOST_DEPTH:  # (composing recurses: 3,000 levels overflowed Python's stack)
            raise yaml.composer.ComposerError(
                None, None, f"nested deeper than {MOST_DEPTH} levels (no field is)",
                event.start_mark)
        self._depth = depth + 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth = depth

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _value in node.value:
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, (str, int, float, bool)):
                continue  # an unhashable key: the schema refuses it with its path
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"the key {key!r} is given twice in one mapping",
                    key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)

    def resolve(self, kind, value, implicit):
        """A plain scalar longer than any number a field takes is a string: PyYAML's number
        patterns backtrack over a long run of digits (two 4,000-digit numbers took 2 s), and
        the schema then names the field that wants a number."""
        if kind is yaml.ScalarNode and implicit[0] and len(value) > MAX_NUMBER_CHARS:
            return self.DEFAULT_SCALAR_TAG
        return super().resolve(kind, value, implicit)
