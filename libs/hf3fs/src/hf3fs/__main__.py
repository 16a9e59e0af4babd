"""``python -m hf3fs``: the ``hf3fs`` command line."""

import sys

from hf3fs.cli import main

sys.exit(main())
