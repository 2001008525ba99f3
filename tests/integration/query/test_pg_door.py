"""The doors for SQL clients end to end: the Postgres door, with real clients: psql (Debian's postgresql-client), psycopg 3,
SQLAlchemy with pandas' `read_sql`, over a lake written by the real stream and the query service's
engine (Spark and the in-process engine). A tenant sees its own rows and the views' names only,
in any answer, and gets past no limit of the HTTP door. Spark's JDBC/ODBC door (`serve-jdbc`),
the operator's, answers beeline over the same lake as `sql` does."""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import psycopg
import pyspark
import pytest
import sqlalchemy
from pydantic import SecretStr

from infra.service.pg_door import PgDoor, PgDoorConfig
from infra.service.query_metrics import QueryMetrics
from infra.service.tenant_access import KeyCheck, TenantLimits
from storage.lake.tables import WINDOWS
from storage.query.local_sql import LocalSql
from storage.query.query_service import QueryService
from storage.query.view_catalog import (
    TENANT_VIEW_NAMES,
    WINDOW_CONTENTS,
    WINDOW_CONTENTS_COLUMNS,
)
from tenants.api_keys import issue_key, revoke_key
from tenants.conf_reader import ConfReader
from tenants.models import QueryLimits
from tests.support.pipeline_harness import Pipeline
from tests.support.secured_kafka import make_certificates
from tests.support.served_lake import with_query_limits
from tests.support.sql_escapes import ESCAPES_REFUSED, ESCAPES_SEEING_ONLY_THE_TENANT, PASSWD_MARK

pytestmark = pytest.mark.integration

RECHECK_S = 1.0
PSQL = shutil.which("psql")
TABLE_NAMES = [name for name in TENANT_VIEW_NAMES if name != WINDOW_CONTENTS]
"""The lake's tables, which the door shows as tables; `window_contents` is a view over them."""
# Catalog statements clients send, and ones a curious tenant might: none may name another
# tenant, and each must answer.
CATALOG_PROBES = [
    "SELECT * FROM pg_catalog.pg_database",
    "SELECT * FROM pg_catalog.pg_class",
    "SELECT * FROM pg_catalog.pg_namespace",
    "SELECT * FROM pg_catalog.pg_views",
    "SELECT * FROM pg_catalog.pg_tables",
    "SELECT * FROM pg_catalog.pg_attribute",
    "SELECT * FROM pg_catalog.pg_roles",
    "SELECT * FROM pg_catalog.pg_settings",
    "SELECT * FROM information_schema.tables",
    "SELECT * FROM information_schema.columns",
    "SELECT * FROM information_schema.schemata",
    "SELECT pg_catalog.version(), current_schema(), current_database(), current_user",
]


@pytest.fixture(scope="module")
def pipeline(served_lake: Pipeline, tmp_path_factory: pytest.TempPathFactory) -> Pipeline:
    limits = {
        # Room for Spark's nested-loop join of an accepted trick on a busy machine.
        "acme": {"max_queries_per_minute": 100_000, "statement_timeout": "120s"},
        "initech": {"max_queries_per_minute": 2},
    }
    return with_query_limits(served_lake, tmp_path_factory.mktemp("pg-door"), limits)


@pytest.fixture(scope="module")
def lake_conf(pipeline: Pipeline) -> Path:
    return pipeline.conf_dir


@pytest.fixture(scope="module")
def keys(lake_conf: Path) -> dict[str, str]:
    return {tenant: issue_key(lake_conf, tenant) for tenant in ("acme", "globex", "initech")}


@pytest.fixture(scope="module")
def door(pipeline: Pipeline, spark: Any, lake_conf: Path) -> Iterator[PgDoor]:
    lake = pipeline.lake
    limits = TenantLimits(QueryLimits(), ConfReader(lake_conf), RECHECK_S)
    local = LocalSql(lake, max_tenant_bytes=64 << 20, cache_bytes=256 << 20)
    service = QueryService(spark, lake, limits, local)
    keys = KeyCheck(lake_conf, SecretStr("operator-key-for-tests"), RECHECK_S)
    with PgDoor(service, keys, QueryMetrics(), limits, PgDoorConfig(port=0)) as door:
        yield door


def connect(door: PgDoor, tenant: str, key: str, **extra: Any) -> psycopg.Connection[Any]:
    return psycopg.connect(
        host="127.0.0.1",
        port=door.port,
        user=tenant,
        password=key,
        dbname="lake",
        connect_timeout=10,
        **extra,
    )


def psql(
    door: PgDoor, tenant: str, key: str, *commands: str, **env: str
) -> subprocess.CompletedProcess[str]:
    assert PSQL is not None, "psql is missing: apt-get install -y postgresql-client"
    arguments = [PSQL, "-X", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p", str(door.port)]
    arguments += ["-U", tenant, "-d", "lake"]
    for command in commands:
        arguments += ["-c", command]
    return subprocess.run(
        arguments,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PGPASSWORD": key, "PGCONNECT_TIMEOUT": "10", **env},
        check=False,
    )


def test_psql_lists_the_tables_and_groups_the_tenants_windows(
    door: PgDoor, keys: dict[str, str]
) -> None:
    listed = psql(door, "acme", keys["acme"], r"\dt")
    assert listed.returncode == 0, listed.stderr
    assert all(f" {name} " in listed.stdout for name in TABLE_NAMES), listed.stdout
    assert "globex" not in listed.stdout
    statement = "SELECT source, count(*) AS n FROM windows GROUP BY source ORDER BY source"
    grouped = psql(door, "acme", keys["acme"], statement)
    assert grouped.returncode == 0, grouped.stderr
    lines = [line.split("|") for line in grouped.stdout.splitlines() if "|" in line]
    expected = door.service.run("acme", statement).table.to_pylist()
    assert expected, "acme has windows"
    assert [[part.strip() for part in line] for line in lines] == [
        ["source", "n"],
        *([row["source"], str(row["n"])] for row in expected),
    ]


OTHER_TENANTS = ("globex", "initech")


def cells(psql_output: str) -> list[list[str]]:
    """The rows of psql's aligned tables, header rows included, each as its stripped cells."""
    return [
        [cell.strip() for cell in line.split("|")]
        for line in psql_output.splitlines()
        if "|" in line
    ]


def described(door: PgDoor, tenant: str, key: str, command: str) -> str:
    """What psql prints for a meta-command, checked to name no tenant but the caller."""
    answer = psql(door, tenant, key, command)
    assert answer.returncode == 0, answer.stderr
    shown = answer.stdout + answer.stderr
    assert not [other for other in ("acme", *OTHER_TENANTS) if other in shown], shown
    return answer.stdout


def sent_columns(door: PgDoor, key: str, view: str) -> list[list[str]]:
    """Each column of `view` and the type the door sends its values with, as Postgres names it."""
    with connect(door, "acme", key, autocommit=True) as connection:
        cursor = connection.execute(f"SELECT * FROM {view} LIMIT 0")
        return [
            [column.name, psycopg.postgres.types.get(column.type_code).regtype]  # type: ignore[union-attr]
            for column in cursor.description or ()
        ]


@pytest.mark.parametrize(
    "command", [r"\d windows", r"\d events", r"\d+ windows", r"\d public.late_events"]
)
def test_psql_describes_a_table_with_the_types_its_rows_come_in(
    door: PgDoor, keys: dict[str, str], command: str
) -> None:
    table_name = command.split()[-1].removeprefix("public.")
    shown = described(door, "acme", keys["acme"], command)
    assert f'Table "public.{table_name}"' in shown, shown
    table = cells(shown)
    assert table[0][:5] == ["Column", "Type", "Collation", "Nullable", "Default"], shown
    assert [row[:2] for row in table[1:]] == sent_columns(door, keys["acme"], table_name)
    if command.startswith("\\d+"):
        assert table[0][5:7] == ["Storage", "Compression"], shown
    # The catalog is the views' alone: every tenant is told the same.
    assert described(door, "globex", keys["globex"], command) == shown


def test_psql_describes_window_contents_with_its_definition(
    door: PgDoor, keys: dict[str, str]
) -> None:
    shown = described(door, "acme", keys["acme"], r"\d+ window_contents")
    definition = shown.split("View definition:", 1)[1]
    assert "FROM windows AS pane" in definition and "JOIN events AS record" in definition
    assert [row[0] for row in cells(shown)[1:]] == list(WINDOW_CONTENTS_COLUMNS)


def listed(door: PgDoor, keys: dict[str, str], command: str) -> list[list[str]]:
    """(schema, name, type, owner) of each relation psql's `command` lists for acme."""
    table = cells(described(door, "acme", keys["acme"], command))
    assert table[0][:4] == ["Schema", "Name", "Type", "Owner"]
    return [row[:4] for row in table[1:]]


@pytest.mark.parametrize("command", [r"\dt", r"\dt+"])
def test_psql_lists_the_lakes_tables_in_public(
    door: PgDoor, keys: dict[str, str], command: str
) -> None:
    assert listed(door, keys, command) == [
        ["public", name, "table", "lake"] for name in sorted(TABLE_NAMES)
    ]


@pytest.mark.parametrize("command", [r"\dv", r"\dv+"])
def test_psql_lists_window_contents_as_the_one_view(
    door: PgDoor, keys: dict[str, str], command: str
) -> None:
    assert listed(door, keys, command) == [["public", WINDOW_CONTENTS, "view", "lake"]]


def test_psql_lists_every_relation_one_schema_and_one_database(
    door: PgDoor, keys: dict[str, str]
) -> None:
    assert listed(door, keys, r"\d") == sorted(
        ["public", name, "view" if name == WINDOW_CONTENTS else "table", "lake"]
        for name in TENANT_VIEW_NAMES
    )
    schemas = cells(described(door, "acme", keys["acme"], r"\dn"))
    assert schemas == [["Name", "Owner"], ["public", "lake"]]
    databases = cells(described(door, "acme", keys["acme"], r"\l"))
    assert databases[0][:3] == ["Name", "Owner", "Encoding"]
    assert [row[:3] for row in databases[1:]] == [["lake", "lake", "UTF8"]]


def test_unknown_names_get_the_hint_sql_gives_as_postgres_errors(
    door: PgDoor, keys: dict[str, str]
) -> None:
    with connect(door, "acme", keys["acme"], autocommit=True) as connection:
        with pytest.raises(psycopg.errors.UndefinedColumn) as column:
            connection.execute(
                "SELECT sourse, count(*) FROM windows WHERE is_final = %s GROUP BY 1", (True,)
            ).fetchall()
        assert column.value.sqlstate == "42703"
        assert "unknown column 'sourse': did you mean 'source'?" in str(column.value)
        with pytest.raises(psycopg.errors.UndefinedTable) as relation:
            connection.execute("SELECT source FROM windoes").fetchall()
        assert relation.value.sqlstate == "42P01"
        assert "unknown relation 'windoes': did you mean 'windows'" in str(relation.value)
        # Qualified as clients qualify names, the view is the same view.
        assert connection.execute(
            'SELECT DISTINCT "public"."windows"."tenant" FROM "public"."windows"'
        ).fetchall() == [("acme",)]
    answer = psql(door, "acme", keys["acme"], "SELECT sourse FROM windows")
    assert answer.returncode != 0
    assert "ERROR:  unknown column 'sourse': did you mean 'source'?" in answer.stderr


def test_wrong_revoked_and_foreign_keys_and_unknown_tenants_are_refused_at_the_handshake(
    door: PgDoor, keys: dict[str, str], lake_conf: Path, caplog: pytest.LogCaptureFixture
) -> None:
    doomed = issue_key(lake_conf, "globex", "doomed")
    with connect(door, "globex", doomed) as connection:
        assert connection.execute("SELECT 1 AS one").fetchall() == [(1,)]
    revoke_key(lake_conf, "globex", "doomed")
    time.sleep(RECHECK_S + 0.2)  # the door remembers a verified key this long
    changed = keys["acme"][:-1] + ("x" if keys["acme"][-1] != "x" else "y")
    attempts = [
        ("acme", changed),  # a wrong key
        ("globex", doomed),  # a revoked key
        ("acme", keys["globex"]),  # another tenant's key
        ("nobody", keys["acme"]),  # an unknown tenant
        ("acme", "tw.acme.0000000000000000.guess"),
    ]
    caplog.set_level(logging.INFO)
    for tenant, key in attempts:
        with pytest.raises(psycopg.OperationalError) as refused:
            connect(door, tenant, key).close()
        text = str(refused.value)
        assert "password authentication failed" in text, text
        assert refused.value.sqlstate in ("28P01", None), refused.value.sqlstate
        assert "globex" not in text.replace('user "globex"', "")
    answer = psql(door, "nobody", keys["acme"], "SELECT 1")
    assert answer.returncode == 2 and "password authentication failed" in answer.stderr
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_other_databases_are_refused_and_no_database_is_the_lake(
    door: PgDoor, keys: dict[str, str]
) -> None:
    with pytest.raises(psycopg.OperationalError, match="does not exist"):
        psycopg.connect(
            host="127.0.0.1", port=door.port, user="acme", password=keys["acme"], dbname="other"
        )
    # libpq names the user as the database when none is given.
    with psycopg.connect(
        host="127.0.0.1", port=door.port, user="acme", password=keys["acme"]
    ) as connection:
        assert connection.execute("SELECT current_database()").fetchone() == ("lake",)


def test_psycopg_binds_parameters_and_reads_typed_rows(door: PgDoor, keys: dict[str, str]) -> None:
    statement = (
        "SELECT tenant, source, window_start, count FROM windows "
        "WHERE source = 'web' AND count >= 1 ORDER BY window_start"
    )
    expected = door.service.run("acme", statement).table.to_pylist()
    assert expected, "acme has windows of web"
    with connect(door, "acme", keys["acme"]) as connection:
        rows = connection.execute(
            "SELECT tenant, source, window_start, count FROM windows "
            "WHERE source = %s AND count >= %s ORDER BY window_start",
            ("web", 1),
        ).fetchall()
        assert rows == [tuple(row.values()) for row in expected]
        assert rows[0][2].tzinfo is not None and isinstance(rows[0][3], int)
        # A string parameter stays a string, whatever it holds.
        none = connection.execute(
            "SELECT count(*) FROM events WHERE tenant = %s", ("globex' OR '1'='1",)
        ).fetchone()
        assert none == (0,)
        # Binary results (the fixed-size types), inside psycopg's BEGIN ... COMMIT.
        with connection.cursor(binary=True) as cursor:
            cursor.execute("SELECT count(*) AS n FROM events")
            assert cursor.fetchone() == (5,)


def test_sqlalchemy_inspects_the_views_and_pandas_reads_them(
    door: PgDoor, keys: dict[str, str]
) -> None:
    engine = sqlalchemy.create_engine(
        f"postgresql+psycopg://acme:{keys['acme']}@127.0.0.1:{door.port}/lake"
    )
    try:
        inspector = sqlalchemy.inspect(engine)
        assert inspector.default_schema_name == "public"
        assert inspector.get_table_names() == sorted(TABLE_NAMES)
        assert inspector.get_view_names() == [WINDOW_CONTENTS]
        columns = inspector.get_columns("windows")
        assert [column["name"] for column in columns] == WINDOWS.schema.names
        types = {column["name"]: type(column["type"]) for column in columns}
        assert types["count"] is sqlalchemy.BIGINT and types["source"] is sqlalchemy.TEXT
        assert issubclass(types["window_start"], sqlalchemy.TIMESTAMP)
        assert "SELECT" in (inspector.get_view_definition("window_contents") or "")
        # A reflected view, selected as SQLAlchemy writes it: every name qualified.
        windows = sqlalchemy.Table(
            "windows", sqlalchemy.MetaData(), schema="public", autoload_with=engine
        )
        with engine.connect() as connection:
            chosen = sqlalchemy.select(windows.c.tenant, windows.c.count).where(
                windows.c.source == "web"
            )
            assert {row.tenant for row in connection.execute(chosen)} == {"acme"}
        frame = pd.read_sql(
            "SELECT source, count(*) AS n FROM events GROUP BY source ORDER BY source", engine
        )
        assert frame.to_dict("records") == [
            {"source": "billing", "n": 1},
            {"source": "web", "n": 4},
        ]
        with engine.connect() as connection:
            tenants = connection.execute(sqlalchemy.text("SELECT DISTINCT tenant FROM windows"))
            assert tenants.fetchall() == [("acme",)]
    finally:
        engine.dispose()


# Read as Postgres SQL, these two are harmless statements, not escapes: Postgres comments nest
# (so the second is `SELECT 1`), and the hint is a comment to Postgres, so Spark never sees it.
ANSWERED_AS_POSTGRES = {
    "SELECT /*+ REPARTITION(1000) */ * FROM events": "acme's events",
    "SELECT 1 /* /* */ , reflect('java.lang.System', 'getProperty', 'user.home') */": "1",
}


@pytest.mark.parametrize("statement", ESCAPES_REFUSED)
def test_escapes_are_refused_through_the_door(
    door: PgDoor, keys: dict[str, str], pipeline: Pipeline, statement: str
) -> None:
    with connect(door, "acme", keys["acme"], autocommit=True) as connection:
        if statement in ANSWERED_AS_POSTGRES:
            cursor = connection.execute(statement)
            rows = cursor.fetchall()
            if ANSWERED_AS_POSTGRES[statement] == "1":
                assert rows == [(1,)]
            else:
                names = [column.name for column in cursor.description or ()]
                assert rows and {row[names.index("tenant")] for row in rows} == {"acme"}
            return
        with pytest.raises(psycopg.Error) as refused:
            connection.execute(statement.format(lake=pipeline.lake.root)).fetchall()
        text = str(refused.value)
        assert "globex" not in text and PASSWD_MARK not in text and "\n\tat " not in text


@pytest.mark.parametrize("statement", ESCAPES_SEEING_ONLY_THE_TENANT)
def test_accepted_tricks_see_only_the_callers_rows_through_the_door(
    door: PgDoor, keys: dict[str, str], statement: str
) -> None:
    with connect(door, "acme", keys["acme"], autocommit=True) as connection:
        assert connection.execute(statement).fetchall() == [("acme",)]


@pytest.mark.parametrize("statement", CATALOG_PROBES)
def test_the_catalog_names_no_other_tenant(
    door: PgDoor, keys: dict[str, str], statement: str
) -> None:
    with connect(door, "acme", keys["acme"], autocommit=True) as connection:
        rows = connection.execute(statement).fetchall()
    assert rows
    assert "globex" not in repr(rows)


def test_the_catalog_takes_no_writes_and_no_view_rows(door: PgDoor, keys: dict[str, str]) -> None:
    with connect(door, "acme", keys["acme"], autocommit=True) as connection:
        for statement in (
            "CREATE TABLE pg_catalog_notes AS SELECT 1 AS x",
            "SELECT * FROM pg_catalog.pg_class; CREATE TABLE pg_notes (x int)",
            "SELECT tenant FROM events, pg_catalog.pg_class",
        ):
            with pytest.raises(psycopg.Error):
                connection.execute(statement).fetchall()


def test_limits_and_audit_are_the_services(
    door: PgDoor, keys: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tenant_windows.audit")
    with connect(door, "initech", keys["initech"], autocommit=True) as connection:
        for _ in range(2):
            connection.execute("SELECT count(*) FROM windows").fetchall()
        with pytest.raises(psycopg.Error) as limited:
            connection.execute("SELECT count(*) FROM events").fetchall()
    assert limited.value.sqlstate == "53400"
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "tenant_windows.audit"]
    initech = [line for line in lines if line["tenant"] == "initech"]
    assert [line["outcome"] for line in initech] == ["ok", "ok", "rate_limited"]
    assert all(keys["initech"] not in r.getMessage() for r in caplog.records)


def test_tls_when_given_a_certificate(
    pipeline: Pipeline, spark: Any, lake_conf: Path, keys: dict[str, str], tmp_path: Path
) -> None:
    certificates = make_certificates(tmp_path / "certs")
    limits = TenantLimits(QueryLimits(), ConfReader(lake_conf), RECHECK_S)
    service = QueryService(spark, pipeline.lake, limits, None)
    config = PgDoorConfig(
        port=0,
        cert_file=certificates.server_cert_file,
        key_file=certificates.server_key_file,
    )
    with PgDoor(
        service, KeyCheck(lake_conf, None, RECHECK_S), QueryMetrics(), limits, config
    ) as door:
        with connect(
            door, "acme", keys["acme"], sslmode="verify-full", sslrootcert=str(certificates.ca_file)
        ) as connection:
            assert connection.pgconn.ssl_in_use
            assert connection.execute("SELECT DISTINCT tenant FROM events").fetchall() == [
                ("acme",)
            ]
        with pytest.raises(psycopg.OperationalError, match="TLS"):
            connect(door, "acme", keys["acme"], sslmode="disable").close()
        answer = psql(door, "acme", keys["acme"], "SELECT 1 AS one", PGSSLMODE="require")
        assert answer.returncode == 0, answer.stderr


# --- Spark's JDBC/ODBC door (`serve-jdbc`), the operator's, over the same lake --------------

BEELINE = Path(pyspark.__file__).parent / "bin" / "beeline"
EVERY_TENANT = "SELECT tenant, source, count(*) AS n FROM windows GROUP BY tenant, source"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_serve_jdbc_answers_beeline_as_sql_does(
    pipeline: Pipeline, lake_conf: Path, tmp_path: Path
) -> None:
    port = free_port()
    # The operator's door reads every tenant's views from the lake alone: no tenant config.
    lake = ["--lake-root", pipeline.lake.root]
    scratch = tmp_path / "tmp"  # where the door keeps its thrift server's metastore
    scratch.mkdir()
    environ = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "TMPDIR": str(scratch)}
    log_path = tmp_path / "serve-jdbc.log"
    with log_path.open("w") as log_file:
        server = subprocess.Popen(
            [sys.executable, "-m", "infra.cli", "serve-jdbc", "--port", str(port), *lake],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=environ,
        )
    try:
        deadline = time.monotonic() + 240
        answer = None
        while time.monotonic() < deadline and server.poll() is None:
            answer = subprocess.run(
                [str(BEELINE), "-u", f"jdbc:hive2://127.0.0.1:{port}/", "-n", "operator",
                 "--silent=true", "--outputformat=csv2", "-e", EVERY_TENANT],
                capture_output=True, text=True, timeout=120, env=environ, check=False,
            )  # fmt: skip
            if answer.returncode == 0:
                break
            time.sleep(2)
        assert answer is not None and answer.returncode == 0, log_path.read_text()[-3000:]
        # beeline writes its prompt before the header.
        lines = [line for line in answer.stdout.splitlines() if line.strip()]
        header = next(n for n, line in enumerate(lines) if line.endswith("tenant,source,n"))
        through_jdbc = sorted(tuple(line.split(",")) for line in lines[header + 1 :])
        by_sql = subprocess.run(
            [sys.executable, "-m", "infra.cli", "sql", "--format", "csv", EVERY_TENANT, *lake],
            capture_output=True, text=True, timeout=300, env=environ, check=True,
        )  # fmt: skip
        sql_lines = [line for line in by_sql.stdout.splitlines() if line.strip()]
        assert sorted(tuple(line.split(",")) for line in sql_lines[1:]) == through_jdbc
        # Every tenant with records in the served lake (tests/support/served_lake.py).
        assert {row[0] for row in through_jdbc} == {"acme", "globex", "wayne"}
    finally:
        server.terminate()
        try:
            code = server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=30)
            raise
    # SIGTERM stops the door as Ctrl-C does: exit 0, and its scratch folder is gone.
    assert code == 0, log_path.read_text()[-3000:]
    assert not list(scratch.glob("tw-serve-jdbc-*")), sorted(scratch.iterdir())


def test_serve_jdbc_refuses_an_address_other_than_loopback() -> None:
    refused = subprocess.run(
        [sys.executable, "-m", "infra.cli", "serve-jdbc", "--host", "0.0.0.0"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert refused.returncode == 2
    assert "loopback" in refused.stderr and "Traceback" not in refused.stderr
