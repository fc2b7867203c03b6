"""Where fabriclab keeps a machine's state: run records, caches, the runs' working folders
(``--state-dir``; under /run, so a reboot, which ends every fabric, empties it)."""

from pathlib import Path

DEFAULT_STATE_DIR = Path("/run/fabriclab")
