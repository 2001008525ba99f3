"""`tenant-windows serve-jdbc`: Spark's own JDBC/ODBC door (HiveServer2, the thrift server that
ships in PySpark's jars) over the lake's views, for the operator's BI tools.

The operator's door: every tenant's rows and `deliveries`, the views `sql` registers
(`sql_views.register_views`), shared by every connection (`singleSession`), and registered
again when a table has a new version, so a client reads the lake as it grows.

**Who may connect: whoever can reach the port.** HiveServer2 checks passwords only through
LDAP, Kerberos or a Java class of its own (`CUSTOM`); with none of those here it accepts any
user and password. So the door listens on a loopback address only and refuses any other:
reaching it takes a login on this host (an SSH tunnel from a laptop's BI tool). Tenants are
never given it; theirs is the Postgres door or the HTTP API, which check keys and scope rows.
"""

from __future__ import annotations

import ipaddress
import logging
import tempfile
import threading
from pathlib import Path

from storage.lake.delta_lake import DeltaLake
from storage.lake.tables import LAKE_TABLES
from tenants.settings import AppSettings

log = logging.getLogger(__name__)
_REFRESH_S = 10.0


class JdbcDoorError(ValueError):
    """The door cannot start as asked; the message says why and what to do."""


def check_loopback(host: str) -> None:
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback:
        raise JdbcDoorError(
            f"--host {host}: Spark's thrift server checks no password here, so it listens on "
            "a loopback address only (127.0.0.1); reach it from elsewhere through an SSH "
            "tunnel, and give tenants the Postgres door (serve --pg-port)"
        )


def thrift_conf(host: str, port: int) -> dict[str, str]:
    """Spark settings of the thrift server: where it listens, one session for every
    connection (so they see the views), no authentication (see the module's doc)."""
    hive = {
        "hive.server2.thrift.bind.host": host,
        "hive.server2.thrift.port": str(port),
        "hive.server2.transport.mode": "binary",
        "hive.server2.authentication": "NONE",
        "hive.server2.enable.doAs": "false",
    }
    return {
        "spark.sql.hive.thriftServer.singleSession": "true",
        **{f"spark.hadoop.{name}": value for name, value in hive.items()},
        **{f"spark.{name}": value for name, value in hive.items()},
    }


def serve_jdbc(
    settings: AppSettings, host: str, port: int, master: str | None, stop: threading.Event
) -> None:
    """Run the thrift server over the lake's views until `stop` is set (or interrupted)."""
    from storage.query.spark_views import register_views
    from streaming.pipeline.spark_session import build_spark

    check_loopback(host)
    with tempfile.TemporaryDirectory(prefix="tw-serve-jdbc-") as scratch:
        spark = build_spark(
            "tenant-windows-serve-jdbc",
            master,
            settings.stream.shuffle_partitions,
            extra_conf={
                **thrift_conf(host, port),
                # The thrift server's own metastore (it stores nothing of the lake's).
                "spark.sql.warehouse.dir": str(Path(scratch) / "warehouse"),
                "spark.hadoop.javax.jdo.option.ConnectionURL": (
                    f"jdbc:derby:;databaseName={Path(scratch) / 'metastore'};create=true"
                ),
            },
        )
        lake = DeltaLake.from_settings(settings.lake)
        register_views(spark, lake, None)
        versions = _versions(lake)
        jvm = spark.sparkContext._jvm
        assert jvm is not None
        # Derby (the thrift server's metastore) writes its log to the working folder otherwise.
        jvm.java.lang.System.setProperty(
            "derby.stream.error.file", str(Path(scratch) / "derby.log")
        )
        jvm.org.apache.spark.sql.hive.thriftserver.HiveThriftServer2.startWithContext(
            spark._jsparkSession.sqlContext()
        )
        log.info(
            "Spark's JDBC/ODBC door on jdbc:hive2://%s:%d/ (the operator's: every tenant; "
            "no password is checked, so it listens on loopback only)",
            host,
            port,
        )
        try:
            while not stop.wait(_REFRESH_S):
                latest = _versions(lake)
                if latest != versions:
                    register_views(spark, lake, None)
                    versions = latest
        finally:
            spark.stop()


def _versions(lake: DeltaLake) -> tuple[int, ...]:
    found = []
    for spec in LAKE_TABLES:
        try:
            found.append(lake.open(spec).version())
        except Exception:  # a table not written yet: the views say so
            found.append(-1)
    return tuple(found)
