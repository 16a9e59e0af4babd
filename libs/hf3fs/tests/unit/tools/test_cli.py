from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from hf3fs import cli
from hf3fs.cli import render

from .conftest import LocalFs


class Out(io.StringIO):
    def isatty(self) -> bool:
        return False


def run(fs: LocalFs, *argv: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    out, err = Out(), Out()
    code = cli.run(list(argv), env or {}, out, err, fs=fs)
    return code, out.getvalue(), err.getvalue()


def make_tree(root: Path) -> None:
    (root / "sub" / "deep").mkdir(parents=True)
    (root / "a.txt").write_text("alpha\n")
    (root / "sub" / "b.bin").write_bytes(os.urandom(100_000))
    (root / "sub" / "deep" / "empty").write_bytes(b"")
    (root / "link").symlink_to("a.txt")


def tree(root: Path) -> dict[str, bytes | str]:
    out: dict[str, bytes | str] = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        out[rel] = f"-> {os.readlink(p)}" if p.is_symlink() else "dir" if p.is_dir() else p.read_bytes()
    return out


def test_cp_tree_in_and_out(local_fs: LocalFs, tmp_path: Path) -> None:
    src = tmp_path / "src"
    make_tree(src)
    assert run(local_fs, "mkdir", "-p", "/data/x")[0] == 0
    code, _, err = run(local_fs, "cp", "-r", "--progress", str(src), "hf3fs:/data/x")
    assert code == 0, err
    assert "100%" in err  # the progress bar was drawn and finished
    code, out, _ = run(local_fs, "ls", "/data/x/src")
    assert out.split() == ["a.txt", "link", "sub"]
    code, out, _ = run(local_fs, "ls", "-l", "/data/x/src")
    assert "link -> a.txt" in out and out.startswith("-rw")
    back = tmp_path / "back"
    assert run(local_fs, "cp", "-r", "hf3fs:/data/x/src", str(back))[0] == 0
    assert tree(back) == tree(src)
    code, out, _ = run(local_fs, "cat", "3fs:/data/x/src/a.txt")
    assert (code, out) == (0, "alpha\n")
    code, out, _ = run(local_fs, "du", "/data/x")
    assert out.split()[:1] == [str(100_000 + 6 + len("a.txt"))] or int(out.split()[0]) >= 100_006


def test_cp_file_into_dir_and_new_name(local_fs: LocalFs, tmp_path: Path) -> None:
    f = tmp_path / "f.txt"
    f.write_text("x")
    run(local_fs, "mkdir", "/d")
    assert run(local_fs, "cp", str(f), "hf3fs:/d")[0] == 0
    assert run(local_fs, "cp", str(f), "hf3fs:/d/renamed")[0] == 0
    assert local_fs.listdir("/d") == ["f.txt", "renamed"]
    code, _, err = run(local_fs, "cp", str(tmp_path), "hf3fs:/d")
    assert code == 1 and "use cp -r" in err


def test_rm_to_trash_and_restore(local_fs: LocalFs) -> None:
    run(local_fs, "mkdir", "-p", "/t/keep")
    local_fs.create("/t/keep/f")
    code, _, err = run(local_fs, "rm", "/t")
    assert code == 1 and err == "hf3fs: /t: Is a directory (use rm -r)\n"
    assert run(local_fs, "rm", "-r", "/t")[0] == 0
    assert not local_fs.exists("/t")
    code, out, _ = run(local_fs, "trash", "list")
    entry_id, *_, original = out.split()
    assert original == "/t"
    assert run(local_fs, "trash", "restore", entry_id)[0] == 0
    assert local_fs.exists("/t/keep/f")
    assert run(local_fs, "rm", "--no-trash", "/t/keep/f")[0] == 0
    assert not local_fs.exists("/t/keep/f") and run(local_fs, "trash", "list")[1] == ""


def test_errors_and_exit_codes(local_fs: LocalFs, tmp_path: Path) -> None:
    code, out, err = run(local_fs, "stat", "/missing", "/")
    assert code == 1 and err == "hf3fs: /missing: No such file or directory\n" and "Type: directory" in out
    assert run(local_fs, "rm", "-f", "/missing")[0] == 0
    code, _, err = run(local_fs, "ls", "relative/path")
    assert code == 2 and "not an absolute 3FS path" in err
    code, _, err = run(local_fs, "cp", str(tmp_path), str(tmp_path / "x"))
    assert code == 2 and "hf3fs:/path" in err
    code, _, err = run(local_fs, "quota", "set", "/")
    assert code == 2
    code, _, err = run(local_fs, "nosuch")
    assert code == 2
    code, _, err = run(local_fs, "mkdir", "/a/b/c")
    assert code == 1 and "hf3fs: /a/b/c: No such file or directory" in err


def test_no_cluster_configured() -> None:
    out, err = Out(), Out()
    assert cli.run(["ls", "/"], {}, out, err) == 2
    assert "FF_MGMTD_ADDRESSES" in err.getvalue()
    err = Out()
    assert cli.run(["ls", "/"], {"FF_MGMTD_ADDRESSES": "127.0.0.1:1"}, out, err) == 2
    assert "FF_TOKEN" in err.getvalue()


def test_quota_mv_df(local_fs: LocalFs) -> None:
    run(local_fs, "mkdir", "/q")
    code, out, _ = run(local_fs, "quota", "set", "/q", "--bytes", "10M", "--inodes", "5")
    assert code == 0 and out.strip() == f"/q  bytes 0/{10 << 20}  inodes 1/5"
    assert run(local_fs, "quota", "get", "/q")[1] == out
    assert run(local_fs, "quota", "list")[1] == out
    run(local_fs, "mkdir", "/q/a", "/r")
    assert run(local_fs, "mv", "/q/a", "/r")[0] == 0
    assert local_fs.listdir("/r") == ["a"]
    code, out, _ = run(local_fs, "df", "-h")
    assert code == 0 and "1.0T" in out


@pytest.mark.parametrize(("text", "value"), [("100", 100), ("64K", 65536), ("10G", 10 << 30), ("1.5KiB", 1536)])
def test_parse_size(text: str, value: int) -> None:
    from hf3fs.cli.render import parse_size

    assert parse_size(text) == value


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        ("plain-name_1.txt", "plain-name_1.txt"),
        ("é", "é"),
        ("two words", "'two words'"),
        ("it's", "'it'\\''s'"),
        ("a\nb", "'a'$'\\n''b'"),
        ("\n", "$'\\n'"),
        ("x\x01y\t", "'x'$'\\001''y'$'\\t'"),
    ],
)
def test_names_are_quoted_as_gnu_ls_shell_escape(name: str, shown: str) -> None:
    assert render.quote_name(name) == shown
    if "\n" not in name:
        return
    assert "\n" not in render.quote_name(name)  # one entry, one line


def test_cp_that_fails_leaves_no_file_it_created(local_fs: LocalFs) -> None:
    local_fs.makedirs("/data", exist_ok=True)
    # a source that opens but fails on its first read (EIO at address 0), whoever runs the test
    code, _, err = run(local_fs, "cp", "/proc/self/mem", "hf3fs:/data/copy")
    assert code == 1 and "Input/output error" in err, err
    assert not local_fs.exists("/data/copy")
    with local_fs.open("/data/kept", "wb") as f:
        f.write(b"old")
    assert run(local_fs, "cp", "/proc/self/mem", "hf3fs:/data/kept")[0] == 1
    assert local_fs.exists("/data/kept")  # a file that was there before is not removed
