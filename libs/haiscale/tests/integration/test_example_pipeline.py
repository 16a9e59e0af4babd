"""The pipeline + DDP variant of the example trainer (``examples/gpt/train_pipeline.py``, issue 22 point 3): 4 ranks,
2 stages x 2 replicas, 1F1B; stopped after its checkpoint at step 8 and started again, it resumes from that step
and every loss after equals the uninterrupted run's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ff_testing import free_port
from ff_testing.forkserver import ForkedProcess, ForkServer

EXAMPLE = Path(__file__).parents[4] / "examples" / "gpt"
TINY = ["--batch", "4", "--context", "32", "--dim", "32", "--layers", "2", "--heads", "2", "--chunks", "2",
        "--log-every", "4", "--ckpt-every", "8"]  # fmt: skip
STEPS = 16


def _run(forks: ForkServer, args: list[str], logs: Path) -> None:
    """The trainer on 4 ranks, torchrun-style, to its end."""
    port = str(free_port())
    base = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WORLD_SIZE": "4", "OMP_NUM_THREADS": "1"}
    procs: list[tuple[ForkedProcess, Path]] = []
    for r in range(4):
        log = logs.with_name(f"{logs.name}-rank{r}.log")
        with log.open("wb") as out:
            argv = [sys.executable, str(EXAMPLE / "train_pipeline.py"), *TINY, *args]
            procs.append((forks.start(argv, env={**base, "RANK": str(r)}, stdout=out, stderr=out), log))
    for p, log in procs:
        assert p.wait(timeout=300) == 0, log.read_text(errors="replace")[-3000:]


def _losses(path: Path) -> dict[int, float]:
    return {(d := json.loads(line))["step"]: d["loss"] for line in path.read_text().splitlines()}


@pytest.mark.timeout(600)  # twelve trainer processes in three runs: about 20 s quiet
def test_the_pipeline_example_resumes_from_its_checkpoint_with_the_same_losses(
    tmp_path: Path, torch_forks: ForkServer
) -> None:
    data = tmp_path / "corpus.txt"
    subprocess.run([sys.executable, str(EXAMPLE / "corpus.py"), str(data), "--mib", "0.25"], check=True, timeout=60)
    common = ["--data", str(data)]
    _run(torch_forks, [*common, "--steps", str(STEPS), "--ckpt", str(tmp_path / "ref"), "--metrics",
                       str(tmp_path / "ref.jsonl")], tmp_path / "ref")  # fmt: skip
    ckpt, metrics = tmp_path / "ckpt", tmp_path / "run.jsonl"
    _run(torch_forks, [*common, "--steps", "8", "--ckpt", str(ckpt), "--metrics", str(metrics)], tmp_path / "first")
    assert sorted(p.name for p in ckpt.iterdir()) == ["stage-0", "stage-1"]  # each stage its own checkpoint
    _run(torch_forks, [*common, "--steps", str(STEPS), "--ckpt", str(ckpt), "--metrics", str(metrics)],
         tmp_path / "resumed")  # fmt: skip
    assert "resumed from step 8" in (tmp_path / "resumed-rank0.log").read_text()
    ref, run = _losses(tmp_path / "ref.jsonl"), _losses(metrics)
    assert sorted(run) == sorted(ref) == list(range(1, STEPS + 1))
    # the same data order, RNG states, optimizer moments and reduction order: the same losses, bit for bit
    assert all(run[s] == ref[s] for s in ref), [(s, run[s], ref[s]) for s in ref if run[s] != ref[s]]
    assert run[STEPS] < run[1] - 0.5  # and it learned something
