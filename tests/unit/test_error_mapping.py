"""The daemon's error reasons and the client's exception classes stay in step."""

from __future__ import annotations

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
