"""The generated wire code matches protos/ (regenerated with the pinned grpcio-tools)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_generated_code_is_current_with_the_proto_files() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "protos" / "generate.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_enum_starts_with_an_unspecified_zero_value() -> None:
    from client.wire.v1 import cache_service_pb2 as pb

    for enum in pb.DESCRIPTOR.enum_types_by_name.values():
        assert enum.values[0].number == 0
        assert enum.values[0].name.endswith("_UNSPECIFIED")


def test_importing_the_client_loads_neither_tensorflow_nor_lmdb() -> None:
    code = (
        "import sys, client; bad = {'tensorflow', 'lmdb'} & set(sys.modules); "
        "print(sorted(bad)); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
