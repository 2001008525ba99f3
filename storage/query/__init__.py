"""Reading the lake with SQL: the tenant guard, scoped Spark SQL, the in-process engine, the query
service's engine and the views."""
