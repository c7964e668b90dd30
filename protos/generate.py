"""Generate the Python code for the wire protocol, or check that it is current.

    python protos/generate.py           # rewrite client/wire/v1/*_pb2*.py
    python protos/generate.py --check   # exit 1 when the committed code is stale

The generator is a pinned grpcio-tools, installed (without its dependencies,
which only the generated code's *runtime* needs) into .cache/ on first use.
The pin is old enough that its gencode (protobuf 6.31.1) loads on every
protobuf runtime TensorFlow 2.21 accepts (>=6.31.1,<8).

protoc names the Python module after the proto file's path
(``cacheserver/v1/cache_service.proto`` -> ``cacheserver.v1``); the code lives in
the client's wire package instead (``client.wire.v1``, shared by client and
daemon), so the one import between the generated modules is rewritten to that
package. The proto package, and so every name on the wire, stays
``cacheserver.v1``.
"""

from __future__ import annotations

import argparse
import difflib
import subprocess
import sys
import tempfile
from pathlib import Path

GRPCIO_TOOLS = "grpcio-tools==1.75.1"
ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"
OUT_PACKAGE = ROOT / "client" / "wire" / "v1"
PROTO_MODULE = "cacheserver.v1"  # what protoc calls the module, after the proto's path
OUT_MODULE = "client.wire.v1"
TOOLS_DIR = ROOT / ".cache" / GRPCIO_TOOLS.replace("==", "-")


def _tools() -> Path:
    if not (TOOLS_DIR / "grpc_tools").is_dir():
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--no-deps",
                "--target",
                str(TOOLS_DIR),
                GRPCIO_TOOLS,
            ],
            check=True,
        )
    return TOOLS_DIR


def generate(out_root: Path) -> list[Path]:
    """Run protoc over protos/cacheserver/v1 into out_root; return the written files."""
    protos = sorted(PROTO_ROOT.glob("cacheserver/v1/*.proto"))
    tools = _tools()
    cmd = [
        sys.executable,
        "-c",
        f"import sys; sys.path.insert(0, {str(tools)!r}); "
        "from grpc_tools import protoc; sys.exit(protoc.main(sys.argv))",
        f"-I{PROTO_ROOT}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        *(str(p.relative_to(PROTO_ROOT)) for p in protos),
    ]
    subprocess.run(cmd, check=True, cwd=PROTO_ROOT)
    written = sorted((out_root / "cacheserver" / "v1").glob("*_pb2*.py*"))
    for path in written:
        path.write_text(
            path.read_text().replace(f"from {PROTO_MODULE} import ", f"from {OUT_MODULE} import ")
        )
    return written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if generated code is stale")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
        stale = []
        for path in fresh:
            target = OUT_PACKAGE / path.name
            new = path.read_text()
            old = target.read_text() if target.exists() else ""
            if new == old:
                continue
            stale.append(target)
            if args.check:
                sys.stdout.writelines(
                    difflib.unified_diff(
                        old.splitlines(True), new.splitlines(True), str(target), "generated"
                    )
                )
            else:
                target.write_text(new)
        extra = {p.name for p in OUT_PACKAGE.glob("*_pb2*.py*")} - {p.name for p in fresh}
    if args.check:
        if stale or extra:
            print(
                f"stale generated code: {[str(p) for p in stale] + sorted(extra)}; "
                "run: python protos/generate.py",
                file=sys.stderr,
            )
            return 1
        return 0
    print(f"wrote {len(stale)} file(s) under {OUT_PACKAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
