"""``fireflyer up`` runs the scheduler and prints how to use it with the hfai CLI; those lines work."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from .conftest import Appliance


def _hfai(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("FF_", "HFAI_"))}
    return subprocess.run([sys.executable, "-m", "hfai", *args], capture_output=True, text=True, timeout=60,
                          env={**clean, **env}, check=False)  # fmt: skip


def test_up_prints_hfai_usage_that_works(appliance: Appliance) -> None:
    up = appliance.ok("up")
    found = re.search(r"export HFAI_SERVER=(\S+) HFAI_TOKEN=(\S+)", up.out)
    assert found, up.out
    user = {"HFAI_SERVER": found[1], "HFAI_TOKEN": found[2], "HFAI_CONFIG": str(appliance.state_dir / "hfai.json")}
    admin_token = (appliance.state_dir / "secrets" / "admin_token").read_text().strip()
    admin = {**user, "HFAI_TOKEN": admin_token}

    who = _hfai("whoami", env=user)
    assert who.returncode == 0 and "hfai-demo" in who.stdout and "used 0/2" in who.stdout, who.stderr
    # 3 nodes: in the NORMAL quota (4) but more than the appliance's 2 agents: it could never run.
    too_big = _hfai("python", "train.py", "--", "--nodes", "3", "--priority", "10", env=user)
    assert too_big.returncode == 1 and "could never run" in too_big.stderr, too_big.stderr
    # LOW: hfai-demo has no quota at that level, so the task stays queued.
    sub = _hfai("python", "train.py", "--", "--nodes", "1", "--priority", "0", "--name", "e2e-task", env=user)
    assert sub.returncode == 0, sub.stderr
    task_id = sub.stdout.split()[2]
    listed = _hfai("list", env=user)
    assert "e2e-task" in listed.stdout and "queued" in listed.stdout
    quotas = _hfai("admin", "quota", "list", "hfai-demo", env=admin)
    assert quotas.returncode == 0 and "HIGH" in quotas.stdout, quotas.stderr
    refused = _hfai("admin", "quota", "set", "hfai-demo", "50", "100", env=user)
    assert refused.returncode == 1 and "PERMISSION_DENIED" in refused.stderr
    stop = _hfai("stop", task_id, env=user)
    assert stop.returncode == 0 and "stopped" in stop.stdout, stop.stderr
