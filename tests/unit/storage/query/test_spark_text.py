"""Arrow rows printed as `sql` prints Spark's; each expected text is what Spark 4 printed for the
same values (tests/integration/query/test_sql_in_process.py compares with Spark itself)."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest

from storage.query.spark_text import NotPrintable, java_double, render_rows

UTC = dt.UTC


def sample() -> pa.Table:
    return pa.table(
        {
            "s": pa.array(["a", None, "日本語\n😀"]),
            "d": pa.array([1.5, None, 2 / 3]),
            "ts": pa.array(
                [dt.datetime(2026, 1, 1, tzinfo=UTC), None, dt.datetime(1, 1, 1, 0, 0, 1, 123456)],
                pa.timestamp("us", tz="UTC"),
            ),
            "m": pa.array([[("k", 1.0)], None, [("a", None)]], pa.map_(pa.string(), pa.float64())),
            "bin": pa.array([b"ab", None, b"\x00\xff"]),
        }
    )


def test_the_table_is_what_show_prints_wide_text_and_escapes_included() -> None:
    # 日本語 counts twice, the emoji as its two UTF-16 units, the newline is escaped.
    assert render_rows(sample(), "table", 3) == (
        "+----------+------------------+--------------------------+-----------+-------+\n"
        "|s         |d                 |ts                        |m          |bin    |\n"
        "+----------+------------------+--------------------------+-----------+-------+\n"
        "|a         |1.5               |2026-01-01 00:00:00       |{k -> 1.0} |[61 62]|\n"
        "|NULL      |NULL              |NULL                      |NULL       |NULL   |\n"
        "|日本語\\n😀|0.6666666666666666|0001-01-01 00:00:01.123456|{a -> NULL}|[00 FF]|\n"
        "+----------+------------------+--------------------------+-----------+-------+\n"
        "\n"
    )
    assert render_rows(sample().slice(0, 2), "table", 1) == (
        "+---+---+-------------------+----------+-------+\n"
        "|s  |d  |ts                 |m         |bin    |\n"
        "+---+---+-------------------+----------+-------+\n"
        "|a  |1.5|2026-01-01 00:00:00|{k -> 1.0}|[61 62]|\n"
        "+---+---+-------------------+----------+-------+\n"
        "only showing top 1 row\n"
    )


def test_csv_and_json_lines() -> None:
    table = sample()
    assert render_rows(table, "csv", 3) == (
        "s,d,ts,m,bin\n"
        'a,1.5,2026-01-01 00:00:00,"{""k"":1.0}",YWI=\n'
        ",,,,\n"
        '"日本語\n😀",0.6666666666666666,0001-01-01 00:00:01.123456,"{""a"":null}",AP8=\n'
    )
    assert render_rows(table, "json", 3) == (
        '{"s":"a","d":1.5,"ts":"2026-01-01T00:00:00.000Z","m":{"k":1.0},"bin":"YWI="}\n'
        "{}\n"
        '{"s":"日本語\\n😀","d":0.6666666666666666,"ts":"0001-01-01T00:00:01.123Z",'
        '"m":{"a":null},"bin":"AP8="}\n'
    )
    long = pa.table({"bin": pa.array([b"y" * 58])})
    assert render_rows(long, "csv", 1) == "bin\n" + '"' + "eXl5" * 19 + '\r\neQ=="\n'


@pytest.mark.parametrize(
    ("value", "text"),
    [(1.5, "1.5"), (0.001, "0.001"), (1_000_000.0, "1000000.0"), (-0.0, "-0.0"), (0.0, "0.0"),
     (9_999_999.5, "9999999.5"), (2 / 3, "0.6666666666666666"), (-123.456, "-123.456")],
)  # fmt: skip
def test_doubles_as_java_prints_them(value: float, text: str) -> None:
    assert java_double(value) == text


@pytest.mark.parametrize(
    ("table", "output_format", "limit"),
    [
        (pa.table({"d": pa.array([1e7])}), "json", 1),  # Java 17 may print it otherwise
        (pa.table({"d": pa.array([0.0001])}), "csv", 1),
        (pa.table({"x": pa.array([1], pa.decimal128(5, 2))}), "table", 1),  # not the lake's
        (pa.table({"x": pa.array([1]), "y": pa.array([2])}).rename_columns(["a", "a"]), "csv", 1),
        (pa.table({"x": pa.array([1])}), "table", 0),
    ],
)
def test_what_is_not_known_exactly_is_left_to_spark(
    table: pa.Table, output_format: str, limit: int
) -> None:
    with pytest.raises(NotPrintable):
        render_rows(table, output_format, limit)
