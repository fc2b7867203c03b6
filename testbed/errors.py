"""The two error types every layer raises.

Bad input raises :class:`ConfigError` naming the field path; a failing system command raises
:class:`TestbedError` carrying the command and what it printed.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """Invalid user input. ``str(err)`` reads ``fabric.k: must be even, got 5``."""

    def __init__(self, path: str, message: str) -> None:
        self.path = path
        self.message = message
        super().__init__(f"{path}: {message}" if path else message)

    def under(self, prefix: str) -> ConfigError:
        """Return the same error with ``prefix`` prepended to its field path."""
        path = f"{prefix}.{self.path}" if self.path else prefix
        return ConfigError(path, self.message)


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
