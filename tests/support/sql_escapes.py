"""SQL that tries to escape a tenant's scope: statements the guard must refuse, and statements
it lets through that must still see only the tenant's rows. Shared by every engine's tests (the
CLI's Spark session, the query service, the in-process engine)."""

from __future__ import annotations

# Text of /etc/passwd that must never reach the output.
PASSWD_MARK = "root:"

ESCAPES_REFUSED = [
    "SELECT DISTINCT tenant FROM parquet.`{lake}/events`",
    "SELECT value FROM text.`/etc/passwd`",
    "SELECT reflect('java.lang.System', 'getProperty', 'user.home')",
    "SELECT `reflect`('java.lang.System', 'getProperty', 'user.home')",
    "SELECT java_method('java.lang.System', 'getProperty', 'user.home')",
    "SELECT x FROM events LATERAL VIEW explode(array(reflect('java.lang.System', "
    "'getProperty', 'user.home'))) t AS x",
    "SELECT tenant FROM events WHERE tenant IN (SELECT tenant FROM parquet.`{lake}/events`)",
    "WITH events AS (SELECT * FROM parquet.`{lake}/events`) SELECT DISTINCT tenant FROM events",
    "SELECT DISTINCT tenant FROM global_temp.events",
    "SELECT DISTINCT tenant FROM spark_catalog.default.events",
    "SET spark.sql.runSQLOnFiles=true; SELECT DISTINCT tenant FROM parquet.`{lake}/events`",
    "SELECT * FROM events; DROP VIEW events",
    "CREATE TEMP VIEW everyone AS SELECT * FROM parquet.`{lake}/events`",
    "CACHE TABLE everyone AS SELECT * FROM parquet.`{lake}/events`",
    "ADD JAR /tmp/nothing.jar",
    "INSERT OVERWRITE DIRECTORY '/tmp/tw-escape' SELECT * FROM events",
    "EXPLAIN SELECT * FROM events",
    "DESCRIBE events",
    "SELECT /*+ REPARTITION(1000) */ * FROM events",
    "SELECT input_file_name() FROM events",
    "SELECT TRANSFORM(tenant) USING 'cat /etc/passwd' AS (line) FROM events",
    "SELECT 1 /* /* */ , reflect('java.lang.System', 'getProperty', 'user.home') */",
    "SELECT '${{env:HOME}}' AS home",
    "SELECT * FROM range(3)",
]

ESCAPES_SEEING_ONLY_THE_TENANT = [
    "SELECT DISTINCT tenant FROM events",
    "SELECT DISTINCT tenant FROM EVENTS",
    "SELECT DISTINCT `tenant` FROM `events`",
    "SELECT DISTINCT tenant FROM (SELECT tenant FROM events UNION ALL SELECT tenant FROM windows"
    " UNION ALL SELECT tenant FROM late_events UNION ALL SELECT tenant FROM tenant_status"
    " UNION ALL SELECT tenant FROM window_contents"
    " UNION ALL SELECT tenant FROM quarantine WHERE tenant IS NOT NULL)",
    # A CTE shadowing a view with another view.
    "WITH events AS (SELECT * FROM windows) SELECT DISTINCT tenant FROM events",
    "SELECT DISTINCT tenant FROM events WHERE tenant = 'globex' OR 1 = 1",
    "SELECT DISTINCT coalesce(e.tenant, w.tenant) AS tenant FROM events e"
    " FULL OUTER JOIN windows w ON e.tenant <> w.tenant",
    "SELECT DISTINCT tenant FROM events -- WHERE tenant = 'acme'\n",
]
