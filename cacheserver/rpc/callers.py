"""Who is calling: the principal of each call, from its bearer token or client certificate.

The interceptor (rpc/interceptors.py) names the principal of every call but
health from its ``authorization: Bearer`` header or, under mutual TLS, from
its certificate's subject CN and SANs, and binds it to the call; the service
asks :meth:`Callers.check` before it acts, and holds streams here so that a
reload of the credentials that takes a grant away ends the streams that
used it. What a principal may do is decided in :mod:`cacheserver.access`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

import grpc

from cacheserver import access
from cacheserver.access import Authority, Credentials, Principal, Verb
from cacheserver.catalog.leases import LeaseTable
from cacheserver.logs import shown
from cacheserver.rpc.admission import end_stream

log = logging.getLogger(__name__)


def bearer(metadata: Sequence[tuple[str, Any]] | None) -> str | None:
    """The token of an ``authorization: Bearer`` header; None: no such header."""
    for key, value in metadata or ():
        if key == "authorization" and isinstance(value, str):
            scheme, _, presented = value.partition(" ")
            if scheme.lower() == "bearer":
                return presented.strip()
    return None


def certificate_names(context: grpc.ServicerContext) -> list[str]:
    """The verified client certificate's subject CN and SANs (empty: none)."""
    auth = context.auth_context() or {}
    names = []
    for key in ("x509_common_name", "x509_subject_alternative_name"):
        names += [v.decode(errors="replace") for v in auth.get(key, ())]
    return names


class Callers:
    """The principal of each call in flight, and the streams each holds."""

    def __init__(self, authority: Authority) -> None:
        self.authority = authority
        self._lock = threading.Lock()
        self._calls: dict[int, Principal] = {}
        #: id(context) -> (context, principal, verb, cache, method) of open streams
        self._streams: dict[int, tuple[grpc.ServicerContext, Principal, Verb, str, str]] = {}
        #: operation name -> the name of the principal that started it
        self._starters: dict[str, str] = {}
        authority.on_reload(self._revoke)

    @property
    def credentials(self) -> Credentials:
        return self.authority.credentials

    def from_headers(
        self, metadata: Sequence[tuple[str, Any]] | None
    ) -> tuple[Principal | None, bool]:
        """(principal, final) from the call's headers alone: final is False when only the
        client certificate can tell (no token, and the credentials name certificates)."""
        credentials = self.credentials
        if credentials.open:
            return access.ANYONE, True
        token = bearer(metadata)
        if token is not None:
            return credentials.by_token(token), True
        return None, not credentials.takes_certificates

    def from_certificate(self, context: grpc.ServicerContext) -> Principal | None:
        return self.credentials.by_certificate(certificate_names(context))

    def bind(self, context: grpc.ServicerContext, principal: Principal) -> None:
        with self._lock:
            self._calls[id(context)] = principal

    def unbind(self, context: grpc.ServicerContext) -> Principal | None:
        with self._lock:
            self._streams.pop(id(context), None)
            return self._calls.pop(id(context), None)

    def of(self, context: grpc.ServicerContext) -> Principal:
        with self._lock:
            principal = self._calls.get(id(context))
        if principal is None:  # a servicer called without the interceptor: a bug
            raise AssertionError("a call reached the service without a principal")
        return principal

    def check(
        self, context: grpc.ServicerContext, verb: Verb, cache: str, method: str = ""
    ) -> Principal:
        """The caller, once access allows verb on cache (PermissionDenied otherwise);
        with method, the call is a stream that a later reload may end."""
        principal = self.of(context)
        access.check(principal, verb, cache)
        if method:
            with self._lock:
                self._streams[id(context)] = (context, principal, verb, cache, method)
        return principal

    def started(self, operation: str, principal: Principal) -> None:
        with self._lock:
            self._starters[operation] = principal.name

    def check_follow(self, context: grpc.ServicerContext, operation: str) -> None:
        """PermissionDenied unless the caller started the materialization operation
        ("materialize/CACHE") or may administer its cache."""
        with self._lock:
            starter = self._starters.get(operation, "")
        access.check_follow(
            self.of(context), starter, operation.removeprefix("materialize/"), operation
        )

    def end_leases_with_grants(self, leases: LeaseTable) -> None:
        """On every reload, end the read leases (and so the data-plane tickets) whose
        holders lost read on their cache."""

        def reload(credentials: Credentials) -> None:
            def lost(lease: Any) -> bool:
                return isinstance(lease.holder, Principal) and not access.still_allowed(
                    credentials, lease.holder, Verb.READ, lease.name
                )

            if ended := leases.release_where(lost):
                log.warning(
                    "ended %d read leases whose holders lost read with the reloaded credentials",
                    ended,
                )

        self.authority.on_reload(reload)

    def _revoke(self, credentials: Credentials) -> None:
        with self._lock:
            ended = [
                (ctx, who.name, verb, cache, method)
                for ctx, who, verb, cache, method in self._streams.values()
                if not access.still_allowed(credentials, who, verb, cache)
            ]
            for ctx, *_ in ended:
                self._streams.pop(id(ctx), None)
        for ctx, name, verb, cache, method in ended:
            log.warning(
                "ended %s of %s on cache %r: the reloaded credentials no longer grant it %s",
                method,
                name,
                shown(cache),
                verb.value,
            )
            end_stream(
                ctx,
                grpc.StatusCode.PERMISSION_DENIED,
                f"{name} may no longer {verb.value} cache {shown(cache)!r}: the "
                "daemon's credentials were reloaded without that grant",
            )
