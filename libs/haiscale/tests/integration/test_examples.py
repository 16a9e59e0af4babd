"""The example trainer's variants (issue 22 point 3): ``examples/gpt/train_pipeline.py`` on 4 ranks (2 stages x 2
replicas, 1F1B) and ``examples/gpt/train_fsdp.py`` on 2 ranks (every block a unit). Each, stopped after its
checkpoint at step 8 and started again, resumes from that step, and every loss after equals the uninterrupted
run's, bit for bit."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
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


HOOKED = '''
"""train.py with its checkpoint loads watched: rank 1 waits for the file ``go`` before it looks for a checkpoint."""
import os, runpy, sys, time
from pathlib import Path
sys.path.insert(0, {example!r})
from haiscale import checkpoint as ckpt
signals, rank = Path({signals!r}), os.environ["RANK"]
real_load, real_latest = ckpt.load, ckpt.latest_step

def wait_for_go():
    (signals / f"waiting-{{rank}}").touch()
    while rank == "1" and not (signals / "go").exists():
        time.sleep(0.02)

def latest_step(*args, **kw):
    wait_for_go()
    return real_latest(*args, **kw)

def load(*args, **kw):
    wait_for_go()
    loaded = real_load(*args, **kw)
    print(f"rank {{rank}} loaded step {{loaded.step}}", flush=True)
    (signals / f"loaded-{{rank}}").touch()
    return loaded

ckpt.latest_step, ckpt.load = latest_step, load
sys.argv = [{train!r}, *sys.argv[1:]]
runpy.run_path({train!r}, run_name="__main__")
'''


@pytest.mark.timeout(600)
def test_the_ranks_resume_from_one_checkpoint_when_a_newer_one_is_committed_meanwhile(
    tmp_path: Path, torch_forks: ForkServer
) -> None:
    """A restarted job resumes while the old job's save commits a newer checkpoint: rank 0 has loaded step 8 when
    step 16 appears, before rank 1 looks. Every rank must resume from the same step (else the replicas differ, and
    here rank 1 would be done at once while rank 0 waits for it in its first allreduce)."""
    data = tmp_path / "corpus.txt"
    corpus = torch_forks.start([sys.executable, str(EXAMPLE / "corpus.py"), str(data), "--mib", "0.25"], env=os.environ)
    assert corpus.wait(timeout=60) == 0
    root, other = tmp_path / "ckpt", tmp_path / "other"
    _run(torch_forks, "train.py", 2, ["--data", str(data), "--steps", "8", "--ckpt", str(root)], tmp_path / "first")
    _run(
        torch_forks,
        "train.py",
        2,
        ["--data", str(data), "--steps", "16", "--seed", "1", "--ckpt", str(other)],
        tmp_path / "old-job",
    )
    signals = tmp_path / "signals"
    signals.mkdir()
    hooked = tmp_path / "hooked_train.py"
    hooked.write_text(HOOKED.format(example=str(EXAMPLE), signals=str(signals), train=str(EXAMPLE / "train.py")))
    base = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2"}
    args = [sys.executable, str(hooked), *TINY, "--data", str(data), "--steps", "12", "--ckpt", str(root)]
    logs = [tmp_path / f"resumed-rank{r}.log" for r in (0, 1)]
    procs = []
    for r, log in enumerate(logs):
        with log.open("wb") as out:
            procs.append(torch_forks.start(args, env={**base, "RANK": str(r), "OMP_NUM_THREADS": "1"}, stdout=out))
    try:
        deadline = time.monotonic() + 120
        while not (signals / "waiting-1").exists() or not (signals / "loaded-0").exists():
            assert time.monotonic() < deadline, [log.read_text(errors="replace")[-2000:] for log in logs]
            time.sleep(0.05)
        shutil.copytree(other / "step-000000016", root / "step-000000016")  # the old job's save commits
        (signals / "go").touch()
        for p, log in zip(procs, logs, strict=True):
            assert p.wait(timeout=120) == 0, log.read_text(errors="replace")[-3000:]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for r, log in enumerate(logs):
        assert f"rank {r} loaded step 8" in log.read_text(), log.read_text(errors="replace")[-2000:]
