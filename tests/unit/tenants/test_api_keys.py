"""Tenants' API keys: issued once, stored as hashes, verified, revoked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infra.cli.main import main
from tenants.api_keys import (
    ApiKeyError,
    Caller,
    issue_key,
    key_file,
    read_tenant_keys,
    revoke_key,
    verify_key,
)
from tests.support.sample_conf import SAMPLE_CONF, copy_conf


@pytest.fixture
def conf(tmp_path: Path) -> Path:
    return copy_conf(SAMPLE_CONF, tmp_path)


def test_an_issued_key_verifies_as_its_tenant_and_only_its_hash_is_stored(conf: Path) -> None:
    key = issue_key(conf, "acme", "dashboards")

    assert verify_key(conf, key) == Caller(tenant="acme", key_name="dashboards")
    stored = key_file(conf, "acme").read_text()
    secret = key.rsplit(".", 1)[1]
    assert secret not in stored and key not in stored
    assert json.loads(stored)["keys"][0]["name"] == "dashboards"
    assert key_file(conf, "acme").stat().st_mode & 0o077 == 0


def test_a_changed_borrowed_or_made_up_key_is_refused(conf: Path) -> None:
    acme_key = issue_key(conf, "acme")
    globex_key = issue_key(conf, "globex")
    last = acme_key[-1]
    changed = acme_key[:-1] + ("A" if last != "A" else "B")
    # globex's key id and secret, claimed for acme: the tenant is part of what is hashed.
    borrowed = "tw.acme." + globex_key.split(".", 2)[2]

    for presented in (changed, borrowed, "", "tw", "tw.acme", "tw.../x.y.z", "x" * 10_000):
        assert verify_key(conf, presented) is None, presented
    assert verify_key(conf, globex_key) == Caller(tenant="globex", key_name="key-1")


def test_a_revoked_key_stops_working_and_its_name_can_be_used_again(conf: Path) -> None:
    old = issue_key(conf, "acme", "ci")
    with pytest.raises(ApiKeyError, match="already has an active key named 'ci'"):
        issue_key(conf, "acme", "ci")

    revoke_key(conf, "acme", "ci")
    new = issue_key(conf, "acme", "ci")

    assert verify_key(conf, old) is None
    assert verify_key(conf, new) == Caller(tenant="acme", key_name="ci")
    entries = read_tenant_keys(conf, "acme").keys
    assert [(entry.name, entry.active) for entry in entries] == [("ci", False), ("ci", True)]
    with pytest.raises(ApiKeyError, match="no active key named 'nope'"):
        revoke_key(conf, "acme", "nope")


def test_a_damaged_key_file_is_refused_with_its_path_and_field(conf: Path) -> None:
    issue_key(conf, "acme")
    path = key_file(conf, "acme")
    content = json.loads(path.read_text())
    content["keys"][0]["key_id"] = "not hex"
    path.write_text(json.dumps(content))

    with pytest.raises(ApiKeyError) as refused:
        read_tenant_keys(conf, "acme")
    assert str(path) in str(refused.value) and "keys.0.key_id" in str(refused.value)


def test_the_cli_prints_the_key_alone_and_refuses_an_unknown_tenant(
    conf: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["tenants", "issue-key", "acme", "--name", "ops", "--conf", str(conf)]) == 0
    printed = capsys.readouterr().out
    assert printed.count("\n") == 1
    assert verify_key(conf, printed.strip()) == Caller(tenant="acme", key_name="ops")

    assert main(["tenants", "issue-key", "nobody", "--conf", str(conf)]) == 2
    assert "tenant 'nobody' is not configured" in capsys.readouterr().err
    assert main(["tenants", "issue-key", "acme", "--name", "Bad Name", "--conf", str(conf)]) == 2
    assert "key name 'Bad Name' must match" in capsys.readouterr().err

    assert main(["tenants", "revoke-key", "acme", "ops", "--conf", str(conf)]) == 0
    assert verify_key(conf, printed.strip()) is None
    assert main(["tenants", "revoke-key", "acme", "ops", "--conf", str(conf)]) == 2
