"""The grants model (cacheserver/access.py): parsing the credentials file, and decisions."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from cacheserver import access
from cacheserver.access import Authority, CredentialsError, Verb
from client.wire.status import PermissionDenied

GOOD = """
[[principal]]
name = "team-a"
token = "a-token"
grants = [{ verbs = ["read", "write"], caches = ["team-a-*", "shared-?"] }]

[[principal]]
name = "trainer"
cert = "trainer.example"
grants = [{ verbs = ["read"], caches = ["*"] }]
"""


def credentials(tmp_path: Path, text: str) -> access.Credentials:
    path = tmp_path / "auth.toml"
    path.write_text(text)
    return access.load(path)


def test_grants_allow_exactly_their_verbs_over_their_patterns(tmp_path: Path) -> None:
    creds = credentials(tmp_path, GOOD)
    team_a = creds.by_token("a-token")
    assert team_a is not None and team_a.name == "team-a"
    assert team_a.may(Verb.READ, "team-a-x") and team_a.may(Verb.WRITE, "shared-1")
    assert not team_a.may(Verb.ADMIN, "team-a-x")
    assert not team_a.may(Verb.READ, "team-b-x") and not team_a.may(Verb.READ, "shared-12")
    assert creds.by_token("a-tokem") is None
    trainer = creds.by_certificate(["other", "trainer.example"])
    assert trainer is not None and trainer.may(Verb.READ, "anything")
    with pytest.raises(PermissionDenied, match="trainer may not write cache 'x'"):
        access.check(trainer, Verb.WRITE, "x")


def test_a_token_sha256_stands_for_the_token_and_the_old_token_file_may_do_all(
    tmp_path: Path,
) -> None:
    digest = hashlib.sha256(b"secret").hexdigest()
    path = tmp_path / "auth.toml"
    path.write_text(
        f'[[principal]]\nname = "h"\ntoken_sha256 = "{digest}"\n'
        'grants = [{ verbs = ["read"], caches = ["a"] }]\n'
    )
    creds = access.load(path, b"old-token")
    assert creds.by_token("secret") is not None and creds.by_token(digest) is None
    old = creds.by_token("old-token")
    assert old is not None and all(old.may(v, "any") for v in Verb)
    assert access.load(None).open and not creds.open


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[[principal]]\nname = "x"\ngrants = []\n', "give a token, a token_sha256 or a cert"),
        (
            '[[principal]]\nname = "x"\ntoken = "t"\n'
            'grants = [{ verbs = ["delete"], caches = ["*"] }]\n',
            "each is one of read, write, admin",
        ),
        (
            '[[principal]]\nname = "x"\ntoken = "t"\n'
            'grants = [{ verbs = ["read"], caches = ["../*"] }]\n',
            "caches must be a non-empty list",
        ),
        ('[[principal]]\nname = "x"\ntoken = "t"\ntokens = "u"\n', "unknown keys ['tokens']"),
        ('[[principal]]\nname = "x"\ntoken_sha256 = "abc"\n', "64 hex digits"),
        (
            '[[principal]]\nname = "x"\ntoken = "t"\n[[principal]]\nname = "y"\ntoken = "t"\n',
            "two principals have the same token",
        ),
        ("principal = 3\n", "[[principal]] table"),
        ("[[principal]\n", "not valid TOML"),
    ],
)
def test_a_bad_credentials_file_is_refused_with_what_to_fix(
    tmp_path: Path, text: str, message: str
) -> None:
    with pytest.raises(CredentialsError, match=message.replace("[", r"\[").replace("]", r"\]")):
        credentials(tmp_path, text)


def test_a_reload_that_cannot_be_read_keeps_the_credentials_in_force(tmp_path: Path) -> None:
    path = tmp_path / "auth.toml"
    path.write_text(GOOD)
    authority = Authority(path)
    seen: list[access.Credentials] = []
    authority.on_reload(seen.append)
    path.write_text("[[principal]\n")
    assert not authority.reload() and not seen
    assert authority.credentials.by_token("a-token") is not None
    path.write_text(GOOD.replace("a-token", "b-token"))
    assert authority.reload() and len(seen) == 1
    assert authority.credentials.by_token("a-token") is None


def test_only_the_starter_or_an_admin_of_the_cache_follows_a_materialization(
    tmp_path: Path,
) -> None:
    creds = credentials(tmp_path, GOOD)
    team_a, trainer = creds.by_token("a-token"), creds.named("trainer")
    assert team_a is not None and trainer is not None
    access.check_follow(team_a, "team-a", "team-a-x", "materialize/team-a-x")
    with pytest.raises(PermissionDenied, match="only the principal that started it"):
        access.check_follow(trainer, "team-a", "team-a-x", "materialize/team-a-x")
    with pytest.raises(PermissionDenied):  # resumed at start: no starter, admins only
        access.check_follow(team_a, "", "team-a-x", "materialize/team-a-x")
    assert access.still_allowed(creds, team_a, Verb.READ, "team-a-x")
    assert not access.still_allowed(creds, team_a, Verb.READ, "team-b-x")
