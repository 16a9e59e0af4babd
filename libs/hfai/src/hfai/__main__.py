"""``python -m hfai``: the hfai CLI."""

import sys

from hfai.cli import main

sys.exit(main())
