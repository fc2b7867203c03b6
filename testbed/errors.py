"""The two error types every layer raises.

Bad input raises :class:`ConfigError` naming the field path; a failing system command raises
:class:`TestbedError` carrying the command and what it printed.
"""

from __future__ import annotations


def shown(value: object, limit: int = 120) -> str:
    """A value as an error message quotes it: cut short (a careless paste is not echoed whole,
    and a number of thousands of digits is not converted to text)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10 ** 60:
        return f"a {'negative ' if value < 0 else ''}number of {len(str(abs(value)))} digits"
    if isinstance(value, list):
        value = value[:8]
    elif isinstance(value, dict):
        value = dict(list(value.items())[:8])
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


_CONTROL = "".join(chr(c) for c in (*range(0, 9), *range(11, 32), 127, *range(128, 160)))
_NO_CONTROL = str.maketrans(_CONTROL, "?" * len(_CONTROL))


def printable(text: str, limit: int = 4000, line_limit: int = 500) -> str:
    """A message as a terminal may show it: control characters (an escape sequence in a
    file's key would drive the terminal) as ``?``, each line cut at ``line_limit`` and the
    whole at ``limit`` characters."""
    lines = [line if len(line) <= line_limit else line[:line_limit] + "..."
             for line in text.translate(_NO_CONTROL).split("\n")]
    out = "\n".join(lines)
    return out if len(out) <= limit else out[:limit] + "... (cut)"


class ConfigError(ValueError):
    """Invalid user input. ``str(err)`` reads ``fabric.k: must be even, got 5``."""

    def __init__(self, path: str, message: str,
                 problems: list[tuple[str, str]] | None = None) -> None:
        self.path = path
        self.message = message
        #: every problem found at once, as (field path, message), the first being this one's
        self.problems = problems or [(path, message)]
        super().__init__(f"{path}: {message}" if path else message)

    def under(self, prefix: str) -> ConfigError:
        """Return the same error with ``prefix`` prepended to its field path."""
        def joined(path: str) -> str:
            return f"{prefix}.{path}" if path else prefix
        return ConfigError(joined(self.path), self.message,
                           [(joined(p), m) for p, m in self.problems])


class TestbedError(RuntimeError):
    """A system operation failed (a command, a netlink request, a daemon)."""

    __test__ = False  # not a pytest test class

    def __init__(self, message: str, command: str | None = None, stderr: str | None = None) -> None:
        self.command = command
        self.stderr = stderr
        text = message
        if command:
            text += f"\n  command: {command}"
        if stderr:
            text += f"\n  output: {stderr.strip()}"
        super().__init__(text)
