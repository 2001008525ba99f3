"""The Postgres door's statements without a lake: session commands, the catalog's answers, and
what goes to the query service (Postgres SQL as Spark SQL, parameters as literals)."""

from __future__ import annotations

import pytest

from infra.service.pg_catalog import (
    CatalogDatabase,
    SessionSettings,
    lake_statement,
    reads_catalog,
    session_command,
)
from infra.service.pg_wire import WireError
from storage.lake.tables import WINDOWS
from storage.query.view_catalog import TENANT_VIEW_NAMES, WINDOW_CONTENTS


@pytest.fixture(scope="module")
def catalog() -> CatalogDatabase:
    return CatalogDatabase()


def test_set_show_and_transactions_are_the_sessions() -> None:
    settings = SessionSettings()
    assert session_command("SET application_name = 'dash'", settings).tag == "SET"  # type: ignore[union-attr]
    shown = session_command("SHOW application_name", settings)
    assert shown is not None and shown.rows is not None
    assert shown.rows.to_pylist() == [{"application_name": "dash"}]
    isolation = session_command("show transaction isolation level", settings)
    assert isolation is not None and isolation.rows is not None
    assert isolation.rows.column(0).to_pylist() == ["read committed"]
    assert session_command("BEGIN", settings).transaction is True  # type: ignore[union-attr]
    assert session_command("ROLLBACK TO SAVEPOINT a", settings).transaction is None  # type: ignore[union-attr]
    assert session_command("COMMIT", settings).transaction is False  # type: ignore[union-attr]
    with pytest.raises(WireError) as unknown:
        session_command("SHOW secret_thing", settings)
    assert unknown.value.sqlstate == "42704"
    assert session_command("SELECT 1", settings) is None


def test_parameters_become_literals_of_their_type() -> None:
    statement = lake_statement(
        'SELECT "source", count(*) AS n FROM windows WHERE tenant = $1 AND count > $2 '
        "GROUP BY source",
        ["x' OR '1'='1", 3],
    )
    assert statement == (
        "SELECT `source`, COUNT(*) AS n FROM windows WHERE tenant = 'x\\' OR \\'1\\'=\\'1' "
        "AND count > 3 GROUP BY source"
    )
    with pytest.raises(WireError):
        lake_statement("SELECT * FROM windows WHERE count > $2", [1])


def test_what_postgres_cannot_read_goes_on_as_written() -> None:
    assert lake_statement("SELECT `tenant` FROM `events`", []) == "SELECT `tenant` FROM `events`"
    assert lake_statement("SELECT 1; SELECT 2", []) == "SELECT 1; SELECT 2"


def test_catalog_statements_are_told_from_the_lakes() -> None:
    assert reads_catalog("SELECT * FROM pg_catalog.pg_class")
    assert reads_catalog("select pg_catalog.version()")
    assert not reads_catalog("SELECT count(*) FROM windows")
    assert not reads_catalog("SELECT count(*) FROM windows WHERE source = 'pg_catalog.x'")
    assert not reads_catalog("SELECT count(*) FROM windows -- not pg_class\n")
    with pytest.raises(WireError):
        reads_catalog("SELECT * FROM events, information_schema.tables")


def test_the_catalog_lists_the_views_and_nothing_else(catalog: CatalogDatabase) -> None:
    tables = catalog.answer(
        "SELECT table_name FROM information_schema.tables ORDER BY 1", "acme", [], 5
    )
    assert sorted(tables.column(0).to_pylist()) == sorted(TENANT_VIEW_NAMES)
    rows = catalog.answer(
        "SELECT pg_catalog.version(), current_database(), current_user", "acme", [], 5
    ).to_pylist()
    assert rows[0]["current_database"] == "lake" and rows[0]["current_user"] == "acme"
    assert rows[0]["version"].startswith("PostgreSQL ")


@pytest.mark.parametrize(
    "statement",
    [
        "CREATE TABLE pg_notes (x INT)",
        "SELECT 1; DROP TABLE windows",
        "SELECT * FROM read_text('/etc/passwd') WHERE 'pg_catalog' = 'pg_catalog'",
        "SET pg_catalog.x = 1",
        "ATTACH '/tmp/pg_other.db'",
    ],
)
def test_the_catalog_takes_no_writes_and_no_files(catalog: CatalogDatabase, statement: str) -> None:
    with pytest.raises(WireError):
        catalog.answer(statement, "acme", [], 5)
    views = catalog.answer("SELECT count(*) AS n FROM pg_class", "acme", [], 5).to_pylist()
    assert views == [{"n": len(TENANT_VIEW_NAMES)}]


def test_the_relations_are_in_public_wherever_a_client_looks(catalog: CatalogDatabase) -> None:
    def answer(sql: str) -> list[dict[str, object]]:
        return catalog.answer(sql, "acme", [], 5).to_pylist()

    assert answer("SELECT current_schema() AS s, current_schemas(false) AS p") == [
        {"s": "public", "p": ["public"]}
    ]
    views = answer(
        "SELECT n.nspname, c.relname, c.relkind FROM pg_catalog.pg_class c "
        "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
    )
    assert {v["nspname"] for v in views} == {"public"}
    assert sorted(v["relname"] for v in views) == sorted(TENANT_VIEW_NAMES)
    # The lake's tables are tables; window_contents, the join over them, is the one view.
    assert {v["relname"]: v["relkind"] for v in views} == {
        name: "v" if name == WINDOW_CONTENTS else "r" for name in TENANT_VIEW_NAMES
    }
    tables = answer("SELECT table_name, table_schema, table_type FROM information_schema.tables")
    assert {t["table_name"]: (t["table_schema"], t["table_type"]) for t in tables} == {
        name: ("public", "VIEW" if name == WINDOW_CONTENTS else "BASE TABLE")
        for name in TENANT_VIEW_NAMES
    }
    assert answer("SELECT setting FROM pg_settings WHERE name = 'search_path'") == [
        {"setting": '"$user", public'}
    ]


def test_a_views_columns_have_the_types_its_rows_are_sent_with(catalog: CatalogDatabase) -> None:
    columns = catalog.answer(
        "SELECT a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod) AS type "
        "FROM pg_catalog.pg_attribute a WHERE a.attrelid = 'public.windows'::regclass "
        "ORDER BY a.attnum",
        "acme",
        [],
        5,
    ).to_pylist()
    assert [c["attname"] for c in columns] == WINDOWS.schema.names
    by_name = {c["attname"]: c["type"] for c in columns}
    assert by_name["count"] == "bigint" and by_name["is_final"] == "boolean"
    assert by_name["window_start"] == "timestamp with time zone"
    assert by_name["window_date"] == "date" and by_name["merged_window_ids"] == "json"


def test_qualified_names_of_the_views_are_the_views() -> None:
    statement = lake_statement(
        'SELECT "public"."windows"."source", w.count FROM lake.public.windows AS w '
        "JOIN public.events ON true",
        [],
    )
    assert statement == ("SELECT `windows`.`source`, w.count FROM windows AS w JOIN events ON TRUE")
    assert lake_statement("SELECT * FROM other.windows", []) == "SELECT * FROM other.windows"
    with pytest.raises(WireError):
        reads_catalog("SELECT * FROM public.events, information_schema.tables")
