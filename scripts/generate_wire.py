"""Regenerate the Python modules of the rlmesh-wire-v1 protocol from `proto/`.

    python scripts/generate_wire.py           # rewrite python/rlmesh/remote/wire/
    python scripts/generate_wire.py --check   # exit 1 if the committed modules are stale

The `.proto` files keep the peer's file layout (`rlmesh/env/v1/...`), so protoc
writes imports such as `from rlmesh.env.v1 import ...`. Those are rewritten to
`rlmesh.remote.wire.env.v1`, where the modules live in this package. Needs the
`grpcio-tools` pinned in the `test` extra: another version writes other bytes.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROTO_ROOT = ROOT / "proto"
PACKAGE = "rlmesh.remote.wire"
OUTPUT = ROOT / "python" / Path(*PACKAGE.split("."))
IMPORT = re.compile(r"^from rlmesh\.((?:core|env|model|spaces)\.v1) import ", re.MULTILINE)


def generate() -> dict[Path, str]:
    """Every generated module, keyed by its path relative to `OUTPUT`."""
    from grpc_tools import protoc

    protos = sorted(str(path.relative_to(PROTO_ROOT)) for path in PROTO_ROOT.rglob("*.proto"))
    with tempfile.TemporaryDirectory() as tmp:
        argv = [
            "protoc",
            f"-I{PROTO_ROOT}",
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}",
            *protos,
        ]
        if protoc.main(argv) != 0:
            raise SystemExit(f"protoc failed on {protos}")
        out = Path(tmp) / "rlmesh"
        modules = {}
        for path in sorted(out.rglob("*.py*")):
            if path.name.endswith("_grpc.py") and "Stub(" not in path.read_text():
                continue  # protoc writes a gRPC module even for files without a service
            text = IMPORT.sub(lambda m: f"from {PACKAGE}.{m.group(1)} import ", path.read_text())
            modules[path.relative_to(out)] = text
    packages = {rel.parent for rel in modules}
    for package in sorted(packages | {p for rel in packages for p in rel.parents}):
        modules.setdefault(package / "__init__.py", "")
    return modules


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args()
    modules = generate()
    written = {p.relative_to(OUTPUT) for p in OUTPUT.rglob("*.py*") if "__pycache__" not in p.parts}
    if args.check:
        stale = sorted(
            str(rel)
            for rel in set(modules) | written
            if not (OUTPUT / rel).exists() or (OUTPUT / rel).read_text() != modules.get(rel)
        )
        if stale:
            print("stale generated modules (run scripts/generate_wire.py):", *stale, sep="\n  ")
            return 1
        return 0
    for rel in written - set(modules):
        (OUTPUT / rel).unlink()
    for rel, text in modules.items():
        (OUTPUT / rel).parent.mkdir(parents=True, exist_ok=True)
        (OUTPUT / rel).write_text(text)
    print(f"wrote {len(modules)} modules under {OUTPUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
