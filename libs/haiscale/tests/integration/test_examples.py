"""The example trainer's variants (issue 22 point 3): ``examples/gpt/train_pipeline.py`` on 4 ranks (2 stages x 2
replicas, 1F1B) and ``examples/gpt/train_fsdp.py`` on 2 ranks (every block a unit). Each, stopped after its
checkpoint at step 8 and started again, resumes from that step, and every loss after equals the uninterrupted
run's, bit for bit."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from ff_testing import free_port
from ff_testing.forkserver import ForkedProcess, ForkServer

EXAMPLE = Path(__file__).parents[4] / "examples" / "gpt"
TINY = [
    "--batch", "4",
    "--context", "32",
    "--dim", "32",
    "--layers", "2",
    "--heads", "2",
    "--log-every", "4",
    "--ckpt-every", "8",
]  # fmt: skip
STEPS = 16
VARIANTS = {  # script, ranks, its own flags
    "pipeline": ("train_pipeline.py", 4, ["--pp", "2", "--chunks", "2"]),
    "fsdp": ("train_fsdp.py", 2, []),
}


def _run(forks: ForkServer, script: str, ranks: int, args: list[str], logs: Path) -> None:
    """The trainer on ``ranks`` ranks, torchrun-style, to its end."""
    base = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "WORLD_SIZE": str(ranks),
        "OMP_NUM_THREADS": "1",
    }
    procs: list[tuple[ForkedProcess, Path]] = []
    for r in range(ranks):
        log = logs.with_name(f"{logs.name}-rank{r}.log")
        with log.open("wb") as out:
            argv = [sys.executable, str(EXAMPLE / script), *TINY, *args]
            procs.append((forks.start(argv, env={**base, "RANK": str(r)}, stdout=out, stderr=out), log))
    for p, log in procs:
        assert p.wait(timeout=300) == 0, log.read_text(errors="replace")[-3000:]


def _losses(path: Path) -> dict[int, float]:
    return {(d := json.loads(line))["step"]: d["loss"] for line in path.read_text().splitlines()}


@pytest.mark.timeout(600)  # three runs of the trainer: about 20 s each variant quiet
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_the_example_variant_resumes_from_its_checkpoint_with_the_same_losses(
    variant: str, tmp_path: Path, torch_forks: ForkServer
) -> None:
    script, ranks, flags = VARIANTS[variant]
    data = tmp_path / "corpus.txt"
    corpus = torch_forks.start([sys.executable, str(EXAMPLE / "corpus.py"), str(data), "--mib", "0.25"], env=os.environ)
    assert corpus.wait(timeout=60) == 0
    common = [*flags, "--data", str(data)]
    ref_metrics, metrics, ckpt = tmp_path / "ref.jsonl", tmp_path / "run.jsonl", tmp_path / "ckpt"
    _run(
        torch_forks,
        script,
        ranks,
        [*common, "--steps", str(STEPS), "--ckpt", str(tmp_path / "ref"), "--metrics", str(ref_metrics)],
        tmp_path / "ref",
    )
    _run(
        torch_forks,
        script,
        ranks,
        [*common, "--steps", "8", "--ckpt", str(ckpt), "--metrics", str(metrics)],
        tmp_path / "first",
    )
    if variant == "pipeline":
        assert sorted(p.name for p in ckpt.iterdir()) == ["stage-0", "stage-1"]  # each stage its own checkpoint
    _run(
        torch_forks,
        script,
        ranks,
        [*common, "--steps", str(STEPS), "--ckpt", str(ckpt), "--metrics", str(metrics)],
        tmp_path / "resumed",
    )
    assert "resumed from step 8" in (tmp_path / "resumed-rank0.log").read_text()
    ref, run = _losses(ref_metrics), _losses(metrics)
    assert sorted(run) == sorted(ref) == list(range(1, STEPS + 1))
    # the same data order, RNG states, optimizer moments and reduction order: the same losses, bit for bit
    assert all(run[s] == ref[s] for s in ref), [(s, run[s], ref[s]) for s in ref if run[s] != ref[s]]
    assert run[STEPS] < run[1] - 0.5  # and it learned something
