"""``python -m fabriclab.cli`` (the guest's job runs the command this way)."""

import sys

from fabriclab.cli.main import main

sys.exit(main())
