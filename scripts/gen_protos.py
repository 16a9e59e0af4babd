"""Generate the Python gRPC code of proto/ into libs/proto/src (one checked-in copy).

Usage: python scripts/gen_protos.py [--check]

--check regenerates into a temporary folder and fails when it differs from what is checked in.
The generator is grpcio-tools + mypy-protobuf at the versions pinned in requirements/constraints.txt, then
gen_clients.py, which writes the typed clients (``*_client.py``, ``fireflyer/rpc_types.py``) from the descriptors.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from gen_clients import write_clients

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
OUT_DIR = ROOT / "libs" / "proto" / "src"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi", "_client.py")
PACKAGE_DOC = '"""Generated gRPC code of fireflyer protos; do not edit (scripts/gen_protos.py)."""\n'


def generate(out_dir: Path) -> None:
    """Run protoc over every .proto under proto/, write the typed clients, add package __init__ files."""
    bin_dir = Path(sys.executable).parent
    protos = sorted(str(p.relative_to(PROTO_DIR)) for p in PROTO_DIR.rglob("*.proto"))
    cmd = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"-I{PROTO_DIR}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--plugin=protoc-gen-mypy={bin_dir / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc={bin_dir / 'protoc-gen-mypy_grpc'}",
        f"--mypy_out={out_dir}",
        f"--mypy_grpc_out={out_dir}",
        f"--descriptor_set_out={out_dir / 'descriptors.pb'}",
        "--include_imports",
        "--include_source_info",
        *protos,
    ]
    # The mypy plugins chatter on stderr; show it only when protoc fails.
    result = subprocess.run(cmd, cwd=PROTO_DIR, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        sys.stderr.write(result.stderr)
        raise SystemExit(f"protoc failed with exit code {result.returncode}")
    descriptors = out_dir / "descriptors.pb"
    write_clients(descriptors, out_dir, set(protos))
    descriptors.unlink()
    for leaf in {p.parent for p in out_dir.rglob("*_pb2.py")}:
        for folder in [leaf, *leaf.parents]:
            if folder == out_dir:
                break
            (folder / "__init__.py").write_text(PACKAGE_DOC)
    (out_dir / "fireflyer" / "py.typed").write_text("")


def generated_files(root: Path) -> set[str]:
    return {
        str(p.relative_to(root))
        for p in (root / "fireflyer").rglob("*")
        if p.is_file()
        and (p.name.endswith(GENERATED_SUFFIXES) or p.name in ("__init__.py", "py.typed", "rpc_types.py"))
    }


def check() -> int:
    """Regenerate into a temporary folder and compare file by file."""
    with tempfile.TemporaryDirectory() as tmp:
        tmp_dir = Path(tmp)
        generate(tmp_dir)
        fresh, current = generated_files(tmp_dir), generated_files(OUT_DIR)
        problems = [f"missing: {name}" for name in sorted(fresh - current)]
        problems += [f"not generated from proto/: {name}" for name in sorted(current - fresh)]
        problems += [
            f"differs: {name}"
            for name in sorted(fresh & current)
            if not filecmp.cmp(tmp_dir / name, OUT_DIR / name, shallow=False)
        ]
    for line in problems:
        print(line, file=sys.stderr)
    if problems:
        print("generated code is stale: run python scripts/gen_protos.py", file=sys.stderr)
        return 1
    print(f"generated code is up to date ({len(fresh)} files)")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if checked-in code differs")
    args = parser.parse_args()
    if args.check:
        return check()
    if (OUT_DIR / "fireflyer").exists():
        shutil.rmtree(OUT_DIR / "fireflyer")
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    generate(OUT_DIR)
    print(f"generated {len(generated_files(OUT_DIR))} files into {OUT_DIR.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
