"""The daemon's error reasons and the client's exception classes stay in step."""

from __future__ import annotations

import re
from pathlib import Path

import grpc

import client.errors as client_errors
import client.wire.status as server_errors
from client.read.fetching.plane import PlaneStatus


def _server_classes() -> list[type[server_errors.CacheServerError]]:
    return [
        c
        for c in vars(server_errors).values()
        if isinstance(c, type) and issubclass(c, server_errors.CacheServerError)
    ]


def test_every_daemon_reason_maps_to_a_client_exception_with_the_same_code() -> None:
    for cls in _server_classes():
        client_cls = client_errors._BY_REASON.get(cls.reason)
        if cls.reason == "SHUTTING_DOWN":
            client_cls = client_errors._BY_CODE[cls.code]
        assert client_cls is not None, f"no client exception for reason {cls.reason}"
        assert client_cls.code == cls.code, cls


def test_the_reason_travels_in_the_same_metadata_key() -> None:
    assert server_errors.REASON_KEY == client_errors.REASON_KEY


def test_two_failed_preconditions_are_told_apart_by_reason() -> None:
    err = client_errors.from_rpc_error(
        PlaneStatus(grpc.StatusCode.FAILED_PRECONDITION, "FINGERPRINT_MISMATCH", "x"), "t"
    )
    assert isinstance(err, client_errors.FingerprintMismatchError)
    err = client_errors.from_rpc_error(
        PlaneStatus(grpc.StatusCode.FAILED_PRECONDITION, "CACHE_WRITING", "x"), "t"
    )
    assert isinstance(err, client_errors.CacheNotReadyError)


def test_an_unavailable_daemon_without_a_reason_names_the_target() -> None:
    err = client_errors.from_rpc_error(
        PlaneStatus(grpc.StatusCode.UNAVAILABLE, "", "connection refused"), "10.0.0.1:5"
    )
    assert isinstance(err, client_errors.ServerUnavailableError)
    assert "10.0.0.1:5" in str(err)


def _protocol_error_table() -> list[tuple[str, list[str], str]]:
    """docs/protocol.md's "Errors" table: (code, reasons, client exception) per row."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "protocol.md").read_text()
    section = doc.split("\n## Errors\n", 1)[1]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("| ") or cells[0] in {"code", "---"}:
            continue
        exception = re.findall(r"`(\w+)`", cells[2])
        rows.append((cells[0], re.findall(r"`(\w+)`", cells[1]), exception[0] if exception else ""))
    return rows


def test_the_protocol_docs_error_table_is_every_reason_with_its_code_and_exception() -> None:
    rows = _protocol_error_table()
    documented = {reason: (code, exc) for code, reasons, exc in rows for reason in reasons}
    for cls in _server_classes():
        if cls is server_errors.CacheServerError:
            continue
        assert cls.reason in documented, f"docs/protocol.md's error table lacks {cls.reason}"
        code, exception = documented[cls.reason]
        assert code == cls.code.name, f"{cls.reason}: the docs say {code}, the code {cls.code.name}"
        client_cls = client_errors._BY_REASON.get(cls.reason) or client_errors._BY_CODE[cls.code]
        assert exception == client_cls.__name__, (cls.reason, exception, client_cls.__name__)
    sent = {cls.reason for cls in _server_classes()}
    assert not set(documented) - sent, f"documented, never sent: {set(documented) - sent}"


def test_the_protocol_docs_name_every_exception_the_client_raises_itself() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "protocol.md").read_text()
    errors_section = doc.split("\n## Errors\n", 1)[1]
    sent = {cls.reason for cls in _server_classes()}
    own = [
        cls.__name__
        for cls in vars(client_errors).values()
        if isinstance(cls, type)
        and issubclass(cls, client_errors.ShardcacheError)
        and cls.__dict__.get("reason") not in sent | {None}
        and cls.reason not in {"UNKNOWN", "UNAVAILABLE"}
    ]
    missing = [name for name in own if f"`{name}`" not in errors_section]
    assert own and not missing, f"docs/protocol.md, Errors, does not name {missing}"
