"""Who may do what: principals, their grants over cache names, and the decision per call.

A credentials file (``--auth-file``, TOML) lists principals. Each has a name
(for logs and the audit trail), how it is recognised (a bearer ``token``, its
``token_sha256`` so the file holds no secret, or ``cert``: the subject CN or a
DNS SAN of its mutual-TLS client certificate) and grants, each some verbs over
cache-name patterns::

    [[principal]]
    name = "team-a-trainer"
    token_sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
    grants = [{ verbs = ["read", "write"], caches = ["team-a-*"] }]

The verbs: ``read`` (list, info, read, read leases), ``write`` (write a cache,
start a materialization, follow and cancel one's own), ``admin`` (rm, pin, unpin,
ttl, deletes in the object store, follow and cancel anyone's materialization).
Patterns are shell-style: ``*`` any run of characters, ``?`` one.

Without any credentials every caller may do everything (the daemon's old
open mode); ``--auth-token-file`` is one principal, ``auth-token-file``, with
every verb over ``*``. This module knows nothing of gRPC: the RPC edge
(cacheserver/rpc/callers.py) asks it and translates its answers.
"""

from __future__ import annotations

import enum
import fnmatch
import hashlib
import hmac
import logging
import re
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cacheserver import metrics
from cacheserver.logs import shown
from cacheserver.security import SecurityConfigError
from client.wire.status import PermissionDenied

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

log = logging.getLogger(__name__)
#: One line per state-changing call: principal, verb, cache, method, result.
audit_log = logging.getLogger("cacheserver.audit")


class Verb(enum.Enum):
    READ = "read"
    WRITE = "write"
    ADMIN = "admin"


ALL_VERBS = frozenset(Verb)
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@:-]{0,127}")
_PATTERN = re.compile(r"[A-Za-z0-9._*?-]{1,200}")
_HEX64 = re.compile(r"[0-9a-f]{64}")


class CredentialsError(SecurityConfigError):
    """The credentials file is missing, unreadable or not what it should be."""


@dataclass(frozen=True)
class Grant:
    verbs: frozenset[Verb]
    caches: tuple[str, ...]

    def allows(self, verb: Verb, cache: str) -> bool:
        return verb in self.verbs and any(fnmatch.fnmatchcase(cache, p) for p in self.caches)


@dataclass(frozen=True)
class Principal:
    name: str
    grants: tuple[Grant, ...]
    token_sha256: bytes = b""
    cert: str = ""

    def may(self, verb: Verb, cache: str) -> bool:
        return any(g.allows(verb, cache) for g in self.grants)


#: Every caller when the daemon has no credentials at all.
ANYONE = Principal("anyone", (Grant(ALL_VERBS, ("*",)),))


def digest(token: str | bytes) -> bytes:
    return hashlib.sha256(token.encode() if isinstance(token, str) else token).digest()


@dataclass(frozen=True)
class Credentials:
    """One reading of the credentials: who is who, and what each may do."""

    principals: tuple[Principal, ...] = ()
    #: No credentials configured: everyone is ANYONE.
    open: bool = False
    _by_name: dict[str, Principal] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        self._by_name.update({p.name: p for p in self.principals})

    @property
    def takes_certificates(self) -> bool:
        return any(p.cert for p in self.principals)

    def by_token(self, token: str) -> Principal | None:
        presented = digest(token)
        found = None
        for p in self.principals:  # every one compared: the time says nothing of which
            if p.token_sha256 and hmac.compare_digest(p.token_sha256, presented):
                found = p
        return found

    def by_certificate(self, names: Iterable[str]) -> Principal | None:
        """The principal whose cert is one of names (the subject CN and the SANs)."""
        wanted = set(names)
        return next((p for p in self.principals if p.cert and p.cert in wanted), None)

    def named(self, name: str) -> Principal | None:
        return ANYONE if self.open else self._by_name.get(name)


def _verbs(value: Any, where: str) -> frozenset[Verb]:
    known = ", ".join(v.value for v in Verb)
    if not isinstance(value, list) or not value:
        raise CredentialsError(f"{where}: verbs must be a non-empty list of {known}")
    try:
        return frozenset(Verb(v) for v in value)
    except ValueError:
        raise CredentialsError(f"{where}: verbs {value!r}: each is one of {known}") from None


def _grant(value: Any, where: str) -> Grant:
    if not isinstance(value, dict) or set(value) != {"verbs", "caches"}:
        raise CredentialsError(
            f"{where}: a grant is a table of verbs and caches, e.g. "
            '{ verbs = ["read"], caches = ["team-a-*"] }'
        )
    caches = value["caches"]
    if (
        not isinstance(caches, list)
        or not caches
        or not all(isinstance(c, str) and _PATTERN.fullmatch(c) for c in caches)
    ):
        raise CredentialsError(
            f"{where}: caches must be a non-empty list of cache names or "
            "patterns (letters, digits, . _ - and the wildcards * ?)"
        )
    return Grant(_verbs(value["verbs"], where), tuple(caches))


def _principal(value: Any, where: str) -> Principal:
    keys = {"name", "token", "token_sha256", "cert", "grants"}
    if not isinstance(value, dict) or not set(value) <= keys:
        extra = sorted(set(value) - keys) if isinstance(value, dict) else value
        raise CredentialsError(
            f"{where}: unknown keys {extra}; a principal has {', '.join(sorted(keys))}"
        )
    name = value.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise CredentialsError(f"{where}: name must be a word of letters, digits, . _ @ : -")
    token, hashed, cert = (value.get(k, "") for k in ("token", "token_sha256", "cert"))
    if sum(bool(x) for x in (token, hashed)) > 1:
        raise CredentialsError(f"{where} ({name}): give token or token_sha256, not both")
    if not (token or hashed or cert):
        raise CredentialsError(
            f"{where} ({name}): give a token, a token_sha256 or a cert "
            "(the client certificate's subject CN or SAN)"
        )
    if token and (not isinstance(token, str) or any(not 0x21 <= ord(c) <= 0x7E for c in token)):
        raise CredentialsError(
            f"{where} ({name}): the token must be printable ASCII without "
            "spaces (it travels in a gRPC header)"
        )
    if hashed and (not isinstance(hashed, str) or not _HEX64.fullmatch(hashed.lower())):
        raise CredentialsError(
            f"{where} ({name}): token_sha256 must be 64 hex digits, e.g. "
            "the output of `printf %s TOKEN | sha256sum`"
        )
    if cert and not isinstance(cert, str):
        raise CredentialsError(f"{where} ({name}): cert must be a string")
    grants = value.get("grants", [])
    if not isinstance(grants, list):
        raise CredentialsError(f"{where} ({name}): grants must be a list of tables")
    return Principal(
        name,
        tuple(_grant(g, f"{where} ({name}) grant {i + 1}") for i, g in enumerate(grants)),
        digest(token) if token else bytes.fromhex(hashed) if hashed else b"",
        cert,
    )


def parse(doc: dict[str, Any], source: str) -> tuple[Principal, ...]:
    """The principals of a credentials document (from TOML)."""
    if set(doc) - {"principal"}:
        raise CredentialsError(
            f"{source}: unknown keys {sorted(set(doc) - {'principal'})}; "
            "the file holds [[principal]] tables"
        )
    entries = doc.get("principal", [])
    if not isinstance(entries, list):
        raise CredentialsError(f"{source}: write each principal as a [[principal]] table")
    principals = tuple(_principal(e, f"{source} principal {i + 1}") for i, e in enumerate(entries))
    for attr, what in (("name", "name"), ("token_sha256", "token"), ("cert", "cert")):
        values = [getattr(p, attr) for p in principals if getattr(p, attr)]
        if len(values) != len(set(values)):
            raise CredentialsError(
                f"{source}: two principals have the same {what}; each {what} names one principal"
            )
    return principals


def load(auth_file: Path | None, token: bytes | None = None) -> Credentials:
    """The credentials of --auth-file and --auth-token-file; open when neither is given."""
    principals: tuple[Principal, ...] = ()
    if auth_file is not None:
        try:
            with open(auth_file, "rb") as f:
                doc = tomllib.load(f)
        except OSError as exc:
            raise CredentialsError(f"cannot read --auth-file {auth_file}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise CredentialsError(f"--auth-file {auth_file} is not valid TOML: {exc}") from None
        principals = parse(doc, f"--auth-file {auth_file}")
    if token is not None:
        if any(p.name == "auth-token-file" for p in principals):
            raise CredentialsError(
                "the name auth-token-file is taken by --auth-token-file's "
                "token; name that principal otherwise"
            )
        principals += (Principal("auth-token-file", (Grant(ALL_VERBS, ("*",)),), digest(token)),)
    return Credentials(principals, open=auth_file is None and token is None)


def denied(principal: Principal, verb: Verb, cache: str) -> PermissionDenied:
    metrics.ACCESS_DENIED.labels(verb.value).inc()
    return PermissionDenied(
        f"{principal.name} may not {verb.value} cache {shown(cache)!r}: no grant of "
        f"{verb.value} over it in the daemon's --auth-file; ask its operator for one"
    )


def check(principal: Principal, verb: Verb, cache: str) -> None:
    """Raise PermissionDenied unless principal may do verb on cache."""
    if not principal.may(verb, cache):
        raise denied(principal, verb, cache)


def check_follow(principal: Principal, starter: str, cache: str, operation: str) -> None:
    """Raise PermissionDenied unless principal may see or cancel the materialization of
    cache that starter started ("" when no caller did: resumed at the daemon's start):
    its starter may, and an admin of the cache."""
    if (starter and starter == principal.name) or principal.may(Verb.ADMIN, cache):
        return
    metrics.ACCESS_DENIED.labels(Verb.ADMIN.value).inc()
    raise PermissionDenied(
        f"{principal.name} may not follow or cancel operation {shown(operation)!r}: only the "
        f"principal that started it, or one granted admin over cache {shown(cache)!r} in the "
        "daemon's --auth-file, may"
    )


def still_allowed(credentials: Credentials, principal: Principal, verb: Verb, cache: str) -> bool:
    """Whether reloaded credentials still know principal by the same token or certificate
    and let it do verb on cache (an open stream or lease that used the grant goes on)."""
    now = credentials.named(principal.name)
    return (
        now is not None
        and (now.token_sha256, now.cert) == (principal.token_sha256, principal.cert)
        and now.may(verb, cache)
    )


def audit(principal: str, verb: Verb, cache: str, method: str, result: str) -> None:
    """The audit trail's line for one state-changing call."""
    fields = {
        "principal": principal,
        "verb": verb.value,
        "cache": cache,
        "method": method,
        "result": result,
    }
    audit_log.info(
        "%s %s %s cache=%s result=%s",
        principal,
        verb.value,
        method,
        cache or "-",
        result,
        extra={"fields": fields},
    )


class Authority:
    """The daemon's current credentials; reload() rereads the files (SIGHUP, or a change
    seen by watch()), keeping the old ones when the new cannot be read."""

    def __init__(self, auth_file: Path | None, token: bytes | None = None) -> None:
        self._file = auth_file
        self._token = token
        self.credentials = load(auth_file, token)
        self._stamp = self._stat()
        self._listeners: list[Callable[[Credentials], None]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def on_reload(self, listener: Callable[[Credentials], None]) -> None:
        self._listeners.append(listener)

    def _stat(self) -> tuple[int, int, int] | None:
        if self._file is None:
            return None
        try:
            st = self._file.stat()
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size, st.st_ino

    def reload(self) -> bool:
        """Reread --auth-file; True when the new credentials are in force."""
        if self._file is None:
            log.info("no --auth-file to reread")
            return False
        with self._lock:
            self._stamp = self._stat()
            try:
                credentials = load(self._file, self._token)
            except CredentialsError as exc:
                log.error("kept the previous credentials: %s", exc)
                return False
            self.credentials = credentials
        log.info(
            "credentials reloaded from %s: %d principals", self._file, len(credentials.principals)
        )
        for listener in self._listeners:
            listener(credentials)
        return True

    def watch(self, interval: float = 1.0) -> None:
        """Reload whenever the file changes (a Secret's volume swaps it in place)."""
        if self._file is None or self._thread is not None:
            return

        def run() -> None:
            while not self._stop.wait(interval):
                if self._stat() != self._stamp:
                    self.reload()

        self._thread = threading.Thread(target=run, name="auth-file-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
