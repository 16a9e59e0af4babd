"""The ``hf3fs`` command as a user runs it (a process per command) against a real cluster.

Each command is a process running ``python -m hf3fs ...``, forked from a fork server that imported ``hf3fs.cli``
once (``conftest.run_cli``): a fresh interpreter spends ~0.7 s of CPU (more on a loaded machine) importing it,
and these tests run ~40 commands. ``test_df_of_a_path`` runs its commands in fresh interpreters, as a user does.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from ff_testing.environ import clean_env

from .conftest import FsCluster, run_cli


def hf3fs(
    cluster: FsCluster, *args: str, token: str | None = None, fresh: bool = False
) -> subprocess.CompletedProcess[str]:
    """``hf3fs args...`` as a process, forked from the fork server (``fresh``: a new interpreter)."""
    env = clean_env()
    env.update({"FF_MGMTD_ADDRESSES": cluster.mgmtd, "FF_TOKEN": token or cluster.token})
    return run_cli(list(args), env=env, timeout_s=120, fresh=fresh)


def ok(cluster: FsCluster, *args: str, token: str | None = None, fresh: bool = False) -> str:
    proc = hf3fs(cluster, *args, token=token, fresh=fresh)
    assert proc.returncode == 0, f"hf3fs {' '.join(args)} exited {proc.returncode}: {proc.stderr}"
    return proc.stdout


def make_tree(root: Path) -> None:
    (root / "d1" / "d2").mkdir(parents=True)
    (root / "small.txt").write_text("small\n")
    (root / "d1" / "big.bin").write_bytes(os.urandom(3 * (1 << 20) + 12345))
    (root / "d1" / "d2" / "empty").write_bytes(b"")
    for i in range(20):
        (root / "d1" / f"f{i:02d}").write_text(f"file {i}\n" * i)
    (root / "link").symlink_to("small.txt")


def test_cp_tree_in_and_out_diff_equal(fs_cluster: FsCluster, tmp_path: Path) -> None:
    src = tmp_path / "src"
    make_tree(src)
    ok(fs_cluster, "mkdir", "-p", "/cli/in")
    proc = hf3fs(fs_cluster, "cp", "-r", "--progress", str(src), "hf3fs:/cli/in")
    assert proc.returncode == 0, proc.stderr
    assert "100%" in proc.stderr
    assert ok(fs_cluster, "ls", "/cli/in/src").split() == ["d1", "link", "small.txt"]
    listing = ok(fs_cluster, "ls", "-l", "-R", "hf3fs:/cli/in/src")
    assert "link -> small.txt" in listing and "/cli/in/src/d1/d2:" in listing
    assert ok(fs_cluster, "cat", "3fs:/cli/in/src/small.txt") == "small\n"
    size, inodes = ok(fs_cluster, "du", "/cli/in/src").split()[:2]
    expected = sum(p.stat().st_size for p in src.rglob("*") if p.is_file() and not p.is_symlink())
    assert int(size) >= expected  # symlink targets may count too
    assert int(inodes) >= 26
    out = tmp_path / "out"
    ok(fs_cluster, "cp", "-r", "hf3fs:/cli/in/src", str(out))
    diff = subprocess.run(
        ["diff", "-r", "--no-dereference", str(src), str(out)], capture_output=True, text=True, check=False
    )
    assert diff.returncode == 0, diff.stdout
    assert "Type: file" in ok(fs_cluster, "stat", "/cli/in/src/d1/big.bin")
    assert "Size" in ok(fs_cluster, "df")


def test_df_of_a_path(fs_cluster: FsCluster) -> None:
    size = ok(fs_cluster, "df", fresh=True).splitlines()[1].split()[0]
    assert ok(fs_cluster, "df", "hf3fs:/cli", fresh=True).splitlines()[1].split()[0] == size  # no quota there
    missing = hf3fs(fs_cluster, "df", "/cli/no-such-folder", fresh=True)
    assert missing.returncode == 1 and "No such file or directory" in missing.stderr


def test_rm_to_trash_and_restore(fs_cluster: FsCluster) -> None:
    ok(fs_cluster, "mkdir", "-p", "/cli/trash/keep/deep")
    fs_cluster.client.create("/cli/trash/keep/deep/f")
    kept = fs_cluster.client.stat("/cli/trash/keep")
    refused = hf3fs(fs_cluster, "rm", "/cli/trash/keep")
    assert refused.returncode == 1 and refused.stderr.startswith("hf3fs: /cli/trash/keep: Is a directory")
    ok(fs_cluster, "rm", "-r", "/cli/trash/keep")
    assert not fs_cluster.client.exists("/cli/trash/keep")
    entries = [line.split() for line in ok(fs_cluster, "trash", "list").splitlines()]
    mine = [e for e in entries if e[-1] == "/cli/trash/keep"]
    assert len(mine) == 1
    listed = [e for e in fs_cluster.client.trash_list() if e.entry_id == mine[0][0]]
    assert [(e.original_path, e.inode_id, e.is_dir) for e in listed] == [("/cli/trash/keep", kept.inode_id, True)]
    ok(fs_cluster, "trash", "restore", mine[0][0])
    assert fs_cluster.client.exists("/cli/trash/keep/deep/f")
    ok(fs_cluster, "rm", "-r", "--no-trash", "/cli/trash/keep")
    assert not fs_cluster.client.exists("/cli/trash/keep")
    assert "/cli/trash/keep" not in ok(fs_cluster, "trash", "list")


def test_mv_and_errors(fs_cluster: FsCluster, tmp_path: Path) -> None:
    ok(fs_cluster, "mkdir", "-p", "/cli/mv/a", "/cli/mv/b")
    ok(fs_cluster, "mv", "/cli/mv/a", "/cli/mv/b")
    assert fs_cluster.client.listdir("/cli/mv/b") == ["a"]
    missing = hf3fs(fs_cluster, "cat", "/cli/mv/nope")
    assert (missing.returncode, missing.stderr) == (1, "hf3fs: /cli/mv/nope: No such file or directory\n")
    exists = hf3fs(fs_cluster, "mkdir", "/cli/mv/b")
    assert exists.returncode == 1 and exists.stderr == "hf3fs: /cli/mv/b: File exists\n"
    usage = hf3fs(fs_cluster, "cp", str(tmp_path), str(tmp_path / "x"))
    assert usage.returncode == 2 and "hf3fs:/path" in usage.stderr
    assert hf3fs(fs_cluster, "ls", "relative").returncode == 2
    bad_token = hf3fs(fs_cluster, "ls", "/", token="fft_not-a-token")
    assert bad_token.returncode == 1 and bad_token.stderr.startswith("hf3fs: ")
    assert "token refused" in bad_token.stderr and "cannot reach" not in bad_token.stderr, bad_token.stderr


def test_ls_quotes_names_as_gnu_ls_does(fs_cluster: FsCluster) -> None:
    ok(fs_cluster, "mkdir", "-p", "/cli/names")
    for name in ("plain", "two words", "line\nbreak"):
        fs_cluster.client.create(f"/cli/names/{name}")
    assert ok(fs_cluster, "ls", "/cli/names").splitlines() == ["'line'$'\\n''break'", "plain", "'two words'"]
    long = ok(fs_cluster, "ls", "-l", "/cli/names").splitlines()
    assert len(long) == 3 and long[0].endswith(" 'line'$'\\n''break'")


def test_du_reports_what_it_can_past_an_unreadable_folder(fs_cluster: FsCluster) -> None:
    client = fs_cluster.client
    client.makedirs("/cli/du/open/deeper", exist_ok=True)
    client.makedirs("/cli/du/closed", exist_ok=True)
    for path, size in (("/cli/du/open/a", 1000), ("/cli/du/open/deeper/b", 234), ("/cli/du/closed/c", 5000)):
        with client.open(path, "wb") as f:
            f.write(b"d" * size)
    client.chmod("/cli/du/closed", 0)
    try:
        proc = hf3fs(fs_cluster, "du", "/cli/du")
    finally:
        client.chmod("/cli/du/closed", 0o755)
    assert proc.returncode == 1
    assert proc.stderr == "hf3fs: /cli/du/closed: Permission denied\n" or proc.stderr.startswith(
        "hf3fs: /cli/du/closed: Permission denied ("
    ), proc.stderr
    total, inodes, where = proc.stdout.split()
    assert (int(total), int(inodes), where) == (1234, 6, "/cli/du")  # du, open, deeper, a, b, closed


def test_quota_then_over_limit_cp_fails_clearly(fs_cluster: FsCluster, tmp_path: Path) -> None:
    ok(fs_cluster, "mkdir", "-p", "/cli/quota")
    ok(fs_cluster, "quota", "set", "/cli/quota", "--bytes", "1M", token=fs_cluster.admin_token)
    got = ok(fs_cluster, "quota", "get", "/cli/quota")
    assert f"/{1 << 20}" in got
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(3 << 20))
    proc = hf3fs(fs_cluster, "cp", str(big), "hf3fs:/cli/quota/big.bin")
    assert proc.returncode == 1
    assert proc.stderr.startswith("hf3fs: /cli/quota/big.bin: Disk quota exceeded"), proc.stderr
    assert fs_cluster.client.du("/cli/quota")[0] <= 1 << 20
    assert not fs_cluster.client.exists("/cli/quota/big.bin")  # no empty or partial file left behind
    small = tmp_path / "small.bin"
    small.write_bytes(b"s" * 1000)
    ok(fs_cluster, "cp", str(small), "hf3fs:/cli/quota/small.bin")  # what fits is copied
    assert fs_cluster.client.stat("/cli/quota/small.bin").size == 1000
