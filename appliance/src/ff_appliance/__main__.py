"""``python -m ff_appliance``: the ``fireflyer`` CLI."""

from __future__ import annotations

import sys

from ff_appliance.cli import main

if __name__ == "__main__":
    sys.exit(main())
