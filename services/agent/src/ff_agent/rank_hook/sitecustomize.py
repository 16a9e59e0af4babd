"""An excepthook that writes a rank's error file before it dies, imported by every rank's interpreter.

The agent puts this folder first on PYTHONPATH. The file (timestamp, exception type, message, traceback) lets
the agent tell which rank failed first and why (torch.distributed.elastic's error files).
"""

import json
import os
import sys
import time
import traceback

_PATH = os.environ.get("FF_RANK_ERROR_FILE")
_previous = sys.excepthook


def _write_error_file(exc_type, exc, tb):  # type: ignore[no-untyped-def]
    try:
        if _PATH and not issubclass(exc_type, KeyboardInterrupt):
            record = {
                "timestamp": time.time(),
                "exc_type": exc_type.__name__,
                "message": str(exc)[:4000],
                "traceback": "".join(traceback.format_exception(exc_type, exc, tb))[-16000:],
                "pid": os.getpid(),
            }
            tmp = f"{_PATH}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                json.dump(record, f)
            os.replace(tmp, _PATH)
    except Exception:
        pass
    _previous(exc_type, exc, tb)


if _PATH:
    sys.excepthook = _write_error_file
