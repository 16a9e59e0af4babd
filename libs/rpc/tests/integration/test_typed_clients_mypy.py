"""mypy sees the generated typed clients' types: a wrong request type is an error, the right one is not."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]

SNIPPET = """
from __future__ import annotations

from fireflyer.mgmtd.v1 import mgmtd_pb2
from fireflyer.mgmtd.v1.mgmtd_client import MgmtdServiceApi


async def use(client: MgmtdServiceApi) -> int:
    ok = await client.heartbeat(mgmtd_pb2.HeartbeatRequest(node_id=1))
    version: int = ok.routing_version
    await client.heartbeat(mgmtd_pb2.GetRoutingInfoRequest())
    return version
"""


def test_mypy_rejects_a_wrong_request_type_and_accepts_the_right_one(tmp_path: Path) -> None:
    snippet = tmp_path / "snippet.py"
    snippet.write_text(textwrap.dedent(SNIPPET))
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--follow-imports=silent", str(snippet)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        env={"MYPYPATH": str(ROOT / "libs/proto/src"), "PATH": str(Path(sys.executable).parent)},
    )
    errors = [line for line in result.stdout.splitlines() if ": error:" in line]
    assert len(errors) == 1, result.stdout
    assert "snippet.py:11:" in errors[0]
    assert '"GetRoutingInfoRequest"; expected "HeartbeatRequest"' in errors[0]
