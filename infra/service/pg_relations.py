"""The Postgres catalog the door shows (`pg_catalog`, `information_schema`), as tables of the
shapes Postgres 15 gives them, holding the lake's views and nothing else.

Clients read the catalog with Postgres' own queries (psql's `\\d`, SQLAlchemy's inspector,
JDBC's `DatabaseMetaData`), which name dozens of columns DuckDB's built-in `pg_catalog` lacks
(`relforcerowsecurity`, `datcollate`, ...). So the catalog database holds its own relations and
functions under the names Postgres uses, in DuckDB's default schema `main`, which a cursor
searches before DuckDB's system catalog; `information_schema`, a schema DuckDB keeps for
itself, is `INFORMATION_SCHEMA` here (`pg_catalog` rewrites the name in statements).

Every row is built from the views' schemas (the same for every tenant), so no answer can name a
tenant. Each of the lake's Delta tables is a table (`relkind` `r`, `BASE TABLE` in
`information_schema.tables`), as a user names it and as psql's `\\dt`, SQLAlchemy's
`get_table_names` and BI tools' table lists look for it; a view over them (`window_contents`) is
a view (`relkind` `v`, with its SQL in `pg_views`). Both are read-only. They are in schema
`public`, where Postgres clients look by default (`search_path`, SQLAlchemy's and BI tools'
default schema). Their column types are the ones the door sends for their rows
(`pg_wire.columns_of`), so `\\d windows` and a `SELECT` agree.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import duckdb
import pyarrow as pa

from infra.service import pg_wire as wire

PUBLIC = "public"
INFORMATION_SCHEMA = "pg_information_schema"
"""Where `information_schema`'s relations live in the catalog database."""
DATABASE_OID = 16_384
OWNER_OID = 10
OWNER = "lake"
"""The owner every relation, schema and the database show: one name for every tenant."""
PG_CATALOG_OID, PUBLIC_OID, INFORMATION_SCHEMA_OID = 11, 2_200, 13_000
_FIRST_VIEW_OID = 16_400
_DEFAULT_COLLATION = 100


@dataclass(frozen=True)
class _Type:
    oid: int
    name: str
    shown: str
    """`format_type`'s words for it."""
    length: int
    category: str
    align: str
    array: int
    collation: int = 0


_BASE_TYPES = (
    _Type(wire.BOOL, "bool", "boolean", 1, "B", "c", 1000),
    _Type(wire.BYTEA, "bytea", "bytea", -1, "U", "i", 1001),
    _Type(18, "char", '"char"', 1, "Z", "c", 1002),
    _Type(wire.INT8, "int8", "bigint", 8, "N", "d", 1016),
    _Type(wire.INT2, "int2", "smallint", 2, "N", "s", 1005),
    _Type(wire.INT4, "int4", "integer", 4, "N", "i", 1007),
    _Type(wire.TEXT, "text", "text", -1, "S", "i", 1009, _DEFAULT_COLLATION),
    _Type(wire.OID, "oid", "oid", 4, "N", "i", 1028),
    _Type(wire.JSON, "json", "json", -1, "U", "i", 199),
    _Type(wire.FLOAT4, "float4", "real", 4, "N", "i", 1021),
    _Type(wire.FLOAT8, "float8", "double precision", 8, "N", "d", 1022),
    _Type(wire.UNKNOWN, "unknown", "unknown", -2, "X", "c", 0),
    _Type(wire.VARCHAR, "varchar", "character varying", -1, "S", "i", 1015, _DEFAULT_COLLATION),
    _Type(wire.DATE, "date", "date", 4, "D", "i", 1182),
    _Type(wire.TIMESTAMP, "timestamp", "timestamp without time zone", 8, "D", "d", 1115),
    _Type(wire.TIMESTAMPTZ, "timestamptz", "timestamp with time zone", 8, "D", "d", 1185),
    _Type(wire.NUMERIC, "numeric", "numeric", -1, "N", "i", 1231),
)
_TYPES = (
    *_BASE_TYPES,
    *(
        _Type(t.array, f"_{t.name}", f"{t.shown}[]", -1, "A", t.align, 0, t.collation)
        for t in _BASE_TYPES
        if t.array
    ),
)
TYPE_OF = {t.oid: t for t in _TYPES}
_ELEMENT_OF = {t.array: t.oid for t in _BASE_TYPES if t.array}

# Each relation's columns, as Postgres 15 has them (and the few older clients still ask for:
# relhasoids, relhaspkey, datlastsysoid), in DuckDB's types; `oid` columns are BIGINT.
_O, _B, _T, _I, _S = "BIGINT", "BOOLEAN", "VARCHAR", "INTEGER", "SMALLINT"
_TA, _OA, _SA = "VARCHAR[]", "BIGINT[]", "SMALLINT[]"
_CATALOG: dict[str, str] = {
    "pg_namespace": f"oid {_O}, nspname {_T}, nspowner {_O}, nspacl {_TA}",
    "pg_class": (
        f"oid {_O}, relname {_T}, relnamespace {_O}, reltype {_O}, reloftype {_O}, "
        f"relowner {_O}, relam {_O}, relfilenode {_O}, reltablespace {_O}, relpages {_I}, "
        f"reltuples REAL, relallvisible {_I}, reltoastrelid {_O}, relhasindex {_B}, "
        f"relisshared {_B}, relpersistence {_T}, relkind {_T}, relnatts {_S}, relchecks {_S}, "
        f"relhasrules {_B}, relhastriggers {_B}, relhassubclass {_B}, relrowsecurity {_B}, "
        f"relforcerowsecurity {_B}, relispopulated {_B}, relreplident {_T}, "
        f"relispartition {_B}, relrewrite {_O}, relfrozenxid {_O}, relminmxid {_O}, "
        f"relacl {_TA}, reloptions {_TA}, relpartbound {_T}, relhasoids {_B}, relhaspkey {_B}"
    ),
    "pg_attribute": (
        f"attrelid {_O}, attname {_T}, atttypid {_O}, attstattarget {_I}, attlen {_S}, "
        f"attnum {_S}, attndims {_I}, attcacheoff {_I}, atttypmod {_I}, attbyval {_B}, "
        f"attalign {_T}, attstorage {_T}, attcompression {_T}, attnotnull {_B}, "
        f"atthasdef {_B}, atthasmissing {_B}, attidentity {_T}, attgenerated {_T}, "
        f"attisdropped {_B}, attislocal {_B}, attinhcount {_I}, attcollation {_O}, "
        f"attacl {_TA}, attoptions {_TA}, attfdwoptions {_TA}, attmissingval {_TA}"
    ),
    "pg_type": (
        f"oid {_O}, typname {_T}, typnamespace {_O}, typowner {_O}, typlen {_S}, "
        f"typbyval {_B}, typtype {_T}, typcategory {_T}, typispreferred {_B}, "
        f"typisdefined {_B}, typdelim {_T}, typrelid {_O}, typsubscript {_T}, typelem {_O}, "
        f"typarray {_O}, typinput {_T}, typoutput {_T}, typreceive {_T}, typsend {_T}, "
        f"typmodin {_T}, typmodout {_T}, typanalyze {_T}, typalign {_T}, typstorage {_T}, "
        f"typnotnull {_B}, typbasetype {_O}, typtypmod {_I}, typndims {_I}, "
        f"typcollation {_O}, typdefaultbin {_T}, typdefault {_T}, typacl {_TA}"
    ),
    "pg_database": (
        f"oid {_O}, datname {_T}, datdba {_O}, encoding {_I}, datlocprovider {_T}, "
        f"datistemplate {_B}, datallowconn {_B}, datconnlimit {_I}, datfrozenxid {_O}, "
        f"datminmxid {_O}, dattablespace {_O}, datcollate {_T}, datctype {_T}, "
        f"daticulocale {_T}, daticurules {_T}, datlocale {_T}, datcollversion {_T}, "
        f"datacl {_TA}, datlastsysoid {_O}"
    ),
    "pg_roles": (
        f"rolname {_T}, rolsuper {_B}, rolinherit {_B}, rolcreaterole {_B}, "
        f"rolcreatedb {_B}, rolcanlogin {_B}, rolreplication {_B}, rolconnlimit {_I}, "
        f"rolpassword {_T}, rolvaliduntil TIMESTAMPTZ, rolbypassrls {_B}, rolconfig {_TA}, "
        f"oid {_O}"
    ),
    "pg_user": (
        f"usename {_T}, usesysid {_O}, usecreatedb {_B}, usesuper {_B}, userepl {_B}, "
        f"usebypassrls {_B}, passwd {_T}, valuntil TIMESTAMPTZ, useconfig {_TA}"
    ),
    "pg_auth_members": f"oid {_O}, roleid {_O}, member {_O}, grantor {_O}, admin_option {_B}",
    "pg_am": f"oid {_O}, amname {_T}, amhandler {_T}, amtype {_T}",
    "pg_tablespace": f"oid {_O}, spcname {_T}, spcowner {_O}, spcacl {_TA}, spcoptions {_TA}",
    "pg_collation": (
        f"oid {_O}, collname {_T}, collnamespace {_O}, collowner {_O}, collprovider {_T}, "
        f"collisdeterministic {_B}, collencoding {_I}, collcollate {_T}, collctype {_T}, "
        f"colliculocale {_T}, collicurules {_T}, collversion {_T}"
    ),
    "pg_attrdef": f"oid {_O}, adrelid {_O}, adnum {_S}, adbin {_T}",
    "pg_constraint": (
        f"oid {_O}, conname {_T}, connamespace {_O}, contype {_T}, condeferrable {_B}, "
        f"condeferred {_B}, convalidated {_B}, conrelid {_O}, contypid {_O}, conindid {_O}, "
        f"conparentid {_O}, confrelid {_O}, confupdtype {_T}, confdeltype {_T}, "
        f"confmatchtype {_T}, conislocal {_B}, coninhcount {_I}, connoinherit {_B}, "
        f"conkey {_SA}, confkey {_SA}, conpfeqop {_OA}, conppeqop {_OA}, conffeqop {_OA}, "
        f"confdelsetcols {_SA}, conexclop {_OA}, conbin {_T}"
    ),
    "pg_index": (
        f"indexrelid {_O}, indrelid {_O}, indnatts {_S}, indnkeyatts {_S}, "
        f"indisunique {_B}, indnullsnotdistinct {_B}, indisprimary {_B}, "
        f"indisexclusion {_B}, indimmediate {_B}, indisclustered {_B}, indisvalid {_B}, "
        f"indcheckxmin {_B}, indisready {_B}, indislive {_B}, indisreplident {_B}, "
        f"indkey {_SA}, indcollation {_OA}, indclass {_OA}, indoption {_SA}, indexprs {_T}, "
        f"indpred {_T}"
    ),
    "pg_opclass": (
        f"oid {_O}, opcmethod {_O}, opcname {_T}, opcnamespace {_O}, opcowner {_O}, "
        f"opcfamily {_O}, opcintype {_O}, opcdefault {_B}, opckeytype {_O}"
    ),
    "pg_description": f"objoid {_O}, classoid {_O}, objsubid {_I}, description {_T}",
    "pg_shdescription": f"objoid {_O}, classoid {_O}, description {_T}",
    "pg_inherits": f"inhrelid {_O}, inhparent {_O}, inhseqno {_I}, inhdetachpending {_B}",
    "pg_trigger": (
        f"oid {_O}, tgrelid {_O}, tgparentid {_O}, tgname {_T}, tgfoid {_O}, tgtype {_S}, "
        f"tgenabled {_T}, tgisinternal {_B}, tgconstrrelid {_O}, tgconstrindid {_O}, "
        f"tgconstraint {_O}, tgdeferrable {_B}, tginitdeferred {_B}, tgnargs {_S}, "
        f"tgattr {_SA}, tgargs BLOB, tgqual {_T}, tgoldtable {_T}, tgnewtable {_T}"
    ),
    "pg_policy": (
        f"oid {_O}, polname {_T}, polrelid {_O}, polcmd {_T}, polpermissive {_B}, "
        f"polroles {_OA}, polqual {_T}, polwithcheck {_T}"
    ),
    "pg_rewrite": (
        f"oid {_O}, rulename {_T}, ev_class {_O}, ev_type {_T}, ev_enabled {_T}, "
        f"is_instead {_B}, ev_qual {_T}, ev_action {_T}"
    ),
    "pg_statistic_ext": (
        f"oid {_O}, stxrelid {_O}, stxname {_T}, stxnamespace {_O}, stxowner {_O}, "
        f"stxstattarget {_I}, stxkeys {_SA}, stxkind {_TA}, stxexprs {_T}"
    ),
    "pg_publication": (
        f"oid {_O}, pubname {_T}, pubowner {_O}, puballtables {_B}, pubinsert {_B}, "
        f"pubupdate {_B}, pubdelete {_B}, pubtruncate {_B}, pubviaroot {_B}"
    ),
    "pg_publication_rel": f"oid {_O}, prpubid {_O}, prrelid {_O}, prqual {_T}, prattrs {_SA}",
    "pg_publication_namespace": f"oid {_O}, pnpubid {_O}, pnnspid {_O}",
    "pg_partitioned_table": (
        f"partrelid {_O}, partstrat {_T}, partnatts {_S}, partdefid {_O}, partattrs {_SA}, "
        f"partclass {_OA}, partcollation {_OA}, partexprs {_T}"
    ),
    "pg_foreign_table": f"ftrelid {_O}, ftserver {_O}, ftoptions {_TA}",
    "pg_sequence": (
        f"seqrelid {_O}, seqtypid {_O}, seqstart {_O}, seqincrement {_O}, seqmax {_O}, "
        f"seqmin {_O}, seqcache {_O}, seqcycle {_B}"
    ),
    "pg_enum": f"oid {_O}, enumtypid {_O}, enumsortorder REAL, enumlabel {_T}",
    "pg_range": (
        f"rngtypid {_O}, rngsubtype {_O}, rngmultitypid {_O}, rngcollation {_O}, "
        f"rngsubopc {_O}, rngcanonical {_T}, rngsubdiff {_T}"
    ),
    "pg_extension": (
        f"oid {_O}, extname {_T}, extowner {_O}, extnamespace {_O}, extrelocatable {_B}, "
        f"extversion {_T}, extconfig {_OA}, extcondition {_TA}"
    ),
    "pg_proc": (
        f"oid {_O}, proname {_T}, pronamespace {_O}, proowner {_O}, prolang {_O}, "
        f"procost REAL, prorows REAL, provariadic {_O}, prosupport {_T}, prokind {_T}, "
        f"prosecdef {_B}, proleakproof {_B}, proisstrict {_B}, proretset {_B}, "
        f"provolatile {_T}, proparallel {_T}, pronargs {_S}, pronargdefaults {_S}, "
        f"prorettype {_O}, proargtypes {_OA}, proallargtypes {_OA}, proargmodes {_TA}, "
        f"proargnames {_TA}, proargdefaults {_T}, protrftypes {_OA}, prosrc {_T}, "
        f"probin {_T}, prosqlbody {_T}, proconfig {_TA}, proacl {_TA}"
    ),
    "pg_views": f"schemaname {_T}, viewname {_T}, viewowner {_T}, definition {_T}",
    "pg_tables": (
        f"schemaname {_T}, tablename {_T}, tableowner {_T}, tablespace {_T}, "
        f"hasindexes {_B}, hasrules {_B}, hastriggers {_B}, rowsecurity {_B}"
    ),
    "pg_matviews": (
        f"schemaname {_T}, matviewname {_T}, matviewowner {_T}, tablespace {_T}, "
        f"hasindexes {_B}, ispopulated {_B}, definition {_T}"
    ),
    "pg_indexes": (
        f"schemaname {_T}, tablename {_T}, indexname {_T}, tablespace {_T}, indexdef {_T}"
    ),
    "pg_settings": (
        f"name {_T}, setting {_T}, unit {_T}, category {_T}, short_desc {_T}, "
        f"extra_desc {_T}, context {_T}, vartype {_T}, source {_T}, min_val {_T}, "
        f"max_val {_T}, enumvals {_TA}, boot_val {_T}, reset_val {_T}, sourcefile {_T}, "
        f"sourceline {_I}, pending_restart {_B}"
    ),
}
_INFORMATION_SCHEMA: dict[str, str] = {
    "schemata": (
        f"catalog_name {_T}, schema_name {_T}, schema_owner {_T}, "
        f"default_character_set_catalog {_T}, default_character_set_schema {_T}, "
        f"default_character_set_name {_T}, sql_path {_T}"
    ),
    "tables": (
        f"table_catalog {_T}, table_schema {_T}, table_name {_T}, table_type {_T}, "
        f"self_referencing_column_name {_T}, reference_generation {_T}, "
        f"user_defined_type_catalog {_T}, user_defined_type_schema {_T}, "
        f"user_defined_type_name {_T}, is_insertable_into {_T}, is_typed {_T}, "
        f"commit_action {_T}"
    ),
    "views": (
        f"table_catalog {_T}, table_schema {_T}, table_name {_T}, view_definition {_T}, "
        f"check_option {_T}, is_updatable {_T}, is_insertable_into {_T}, "
        f"is_trigger_updatable {_T}, is_trigger_deletable {_T}, "
        f"is_trigger_insertable_into {_T}"
    ),
    "columns": (
        f"table_catalog {_T}, table_schema {_T}, table_name {_T}, column_name {_T}, "
        f"ordinal_position {_I}, column_default {_T}, is_nullable {_T}, data_type {_T}, "
        f"character_maximum_length {_I}, character_octet_length {_I}, "
        f"numeric_precision {_I}, numeric_precision_radix {_I}, numeric_scale {_I}, "
        f"datetime_precision {_I}, interval_type {_T}, interval_precision {_I}, "
        f"character_set_catalog {_T}, character_set_schema {_T}, character_set_name {_T}, "
        f"collation_catalog {_T}, collation_schema {_T}, collation_name {_T}, "
        f"domain_catalog {_T}, domain_schema {_T}, domain_name {_T}, udt_catalog {_T}, "
        f"udt_schema {_T}, udt_name {_T}, scope_catalog {_T}, scope_schema {_T}, "
        f"scope_name {_T}, maximum_cardinality {_I}, dtd_identifier {_T}, "
        f"is_self_referencing {_T}, is_identity {_T}, identity_generation {_T}, "
        f"identity_start {_T}, identity_increment {_T}, identity_maximum {_T}, "
        f"identity_minimum {_T}, identity_cycle {_T}, is_generated {_T}, "
        f"generation_expression {_T}, is_updatable {_T}"
    ),
    "table_constraints": (
        f"constraint_catalog {_T}, constraint_schema {_T}, constraint_name {_T}, "
        f"table_catalog {_T}, table_schema {_T}, table_name {_T}, constraint_type {_T}, "
        f"is_deferrable {_T}, initially_deferred {_T}, enforced {_T}, nulls_distinct {_T}"
    ),
    "key_column_usage": (
        f"constraint_catalog {_T}, constraint_schema {_T}, constraint_name {_T}, "
        f"table_catalog {_T}, table_schema {_T}, table_name {_T}, column_name {_T}, "
        f"ordinal_position {_I}, position_in_unique_constraint {_I}"
    ),
    "referential_constraints": (
        f"constraint_catalog {_T}, constraint_schema {_T}, constraint_name {_T}, "
        f"unique_constraint_catalog {_T}, unique_constraint_schema {_T}, "
        f"unique_constraint_name {_T}, match_option {_T}, update_rule {_T}, delete_rule {_T}"
    ),
    "constraint_column_usage": (
        f"table_catalog {_T}, table_schema {_T}, table_name {_T}, column_name {_T}, "
        f"constraint_catalog {_T}, constraint_schema {_T}, constraint_name {_T}"
    ),
    "check_constraints": (
        f"constraint_catalog {_T}, constraint_schema {_T}, constraint_name {_T}, check_clause {_T}"
    ),
    "routines": (
        f"specific_catalog {_T}, specific_schema {_T}, specific_name {_T}, "
        f"routine_catalog {_T}, routine_schema {_T}, routine_name {_T}, routine_type {_T}, "
        f"data_type {_T}"
    ),
}

# Postgres' functions over the catalog that clients call; each answers from the tables above.
_FUNCTIONS = (
    f"current_schema() AS '{PUBLIC}'",
    f"current_schemas(implicit) AS CASE WHEN implicit THEN ['pg_catalog', '{PUBLIC}'] "
    f"ELSE ['{PUBLIC}'] END",
    f"pg_get_userbyid(role_id) AS CASE WHEN role_id = {OWNER_OID} THEN '{OWNER}' "
    "ELSE 'unknown (OID=' || role_id || ')' END",
    "pg_encoding_to_char(encoding) AS CASE WHEN encoding = 6 THEN 'UTF8' ELSE '' END",
    "format_type(type_id, type_modifier) AS "
    "(SELECT CASE WHEN type_id IS NULL THEN NULL ELSE coalesce(min(shown), '???') END "
    "FROM main.lake_type_names WHERE oid = type_id)",
    "pg_table_is_visible(relation_id) AS (SELECT count(*) > 0 FROM main.pg_class "
    f"WHERE oid = relation_id AND relnamespace IN ({PG_CATALOG_OID}, {PUBLIC_OID}))",
    "pg_type_is_visible(type_id) AS (SELECT count(*) > 0 FROM main.pg_type "
    f"WHERE oid = type_id AND typnamespace IN ({PG_CATALOG_OID}, {PUBLIC_OID}))",
    "current_setting(setting_name) AS (SELECT min(setting) FROM main.pg_settings "
    "WHERE name = lower(setting_name)), (setting_name, missing_ok) AS "
    "current_setting(setting_name)",
    "pg_collation_is_visible(collation_id) AS true",
    "pg_function_is_visible(function_id) AS true",
    # `schema.name` or `name`, each maybe quoted, as Postgres reads a regclass literal.
    "to_regclass(relation_name) AS (SELECT min(c.oid) FROM main.pg_class c "
    "JOIN main.pg_namespace n ON n.oid = c.relnamespace "
    "WHERE c.relname = replace(string_split(relation_name, '.')[-1], '\"', '') "
    "AND (len(string_split(relation_name, '.')) = 1 "
    "OR n.nspname = replace(string_split(relation_name, '.')[1], '\"', '')))",
    "to_regtype(type_name) AS (SELECT min(oid) FROM main.lake_type_names "
    "WHERE shown = lower(type_name) OR typname = lower(type_name))",
    "to_regnamespace(schema_name) AS "
    "(SELECT min(oid) FROM main.pg_namespace WHERE nspname = schema_name)",
    "pg_get_expr(expression, relation_id) AS NULL::VARCHAR, "
    "(expression, relation_id, pretty) AS NULL::VARCHAR",
    "pg_get_viewdef(view_id) AS (SELECT min(v.definition) FROM main.pg_views v "
    "JOIN main.pg_class c ON c.relname = v.viewname WHERE c.oid = view_id), "
    "(view_id, pretty) AS pg_get_viewdef(view_id)",
    "pg_get_ruledef(rule_id) AS NULL::VARCHAR, (rule_id, pretty) AS NULL::VARCHAR",
    "pg_get_indexdef(index_id) AS NULL::VARCHAR, "
    "(index_id, column_number, pretty) AS NULL::VARCHAR",
    "pg_get_constraintdef(constraint_id) AS NULL::VARCHAR, "
    "(constraint_id, pretty) AS NULL::VARCHAR",
    "pg_get_triggerdef(trigger_id) AS NULL::VARCHAR, (trigger_id, pretty) AS NULL::VARCHAR",
    "pg_get_partkeydef(relation_id) AS NULL::VARCHAR",
    "pg_get_function_result(function_id) AS NULL::VARCHAR",
    "pg_get_function_arguments(function_id) AS NULL::VARCHAR",
    "pg_get_function_identity_arguments(function_id) AS NULL::VARCHAR",
    "pg_get_serial_sequence(relation_name, column_name) AS NULL::VARCHAR",
    "pg_get_statisticsobjdef_columns(statistics_id) AS NULL::VARCHAR",
    "col_description(relation_id, column_number) AS NULL::VARCHAR",
    "obj_description(object_id) AS NULL::VARCHAR, (object_id, catalog_name) AS NULL::VARCHAR",
    "shobj_description(object_id, catalog_name) AS NULL::VARCHAR",
    # A view's rows are the caller's share of a Delta table: no size a catalog could know.
    "pg_table_size(relation_id) AS NULL::BIGINT",
    "pg_relation_size(relation_id) AS NULL::BIGINT, (relation_id, fork) AS NULL::BIGINT",
    "pg_total_relation_size(relation_id) AS NULL::BIGINT",
    "pg_indexes_size(relation_id) AS NULL::BIGINT",
    "pg_database_size(database) AS NULL::BIGINT",
    # psql's `\\d TABLE` asks which publications hold it and where its foreign keys come from:
    # none, and a table is its own only ancestor.
    "pg_relation_is_publishable(relation_id) AS false",
    "pg_partition_ancestors(relation_id) AS TABLE SELECT relation_id AS relid",
    "array_upper(values, dimension) AS len(values)",
)


def install(
    database: duckdb.DuckDBPyConnection,
    views: Mapping[str, pa.Schema],
    definitions: Mapping[str, str],
    settings: Mapping[str, str],
) -> None:
    """Create the catalog's relations and functions in `database`, listing `views` (name: the
    schema of its rows) in schema `public`: those with a definition (their SQL over the others,
    for `pg_get_viewdef`) as views, the others as the lake's tables. `settings` are
    `pg_settings`' rows and what `current_setting` answers: a session's defaults."""
    database.execute(f"CREATE SCHEMA {INFORMATION_SCHEMA}")
    for name, columns in _CATALOG.items():
        database.execute(f"CREATE TABLE main.{name} ({columns})")
    for name, columns in _INFORMATION_SCHEMA.items():
        database.execute(f"CREATE TABLE {INFORMATION_SCHEMA}.{name} ({columns})")
    database.execute(f"CREATE TABLE main.lake_type_names (oid {_O}, typname {_T}, shown {_T})")
    tables = _rows(views, {name: definitions[name] for name in views if name in definitions})
    tables["main.pg_settings"] = [
        {
            "name": name,
            "setting": value,
            "context": "user",
            "vartype": "string",
            "source": "default",
            "boot_val": value,
            "reset_val": value,
            "pending_restart": False,
        }
        for name, value in sorted(settings.items())
    ]
    for name, rows in tables.items():
        if rows:
            database.executemany(
                f"INSERT INTO {name} BY NAME SELECT {', '.join(f'? AS {c}' for c in rows[0])}",
                [list(row.values()) for row in rows],
            )
    for function in _FUNCTIONS:
        database.execute(f"CREATE MACRO main.{function}")


def _rows(
    views: Mapping[str, pa.Schema], definitions: Mapping[str, str]
) -> dict[str, list[dict[str, Any]]]:
    """The rows of every relation that has any, by its name in the catalog database; the
    relations of `views` with a definition are views, the others the lake's tables."""
    oids = {name: _FIRST_VIEW_OID + number for number, name in enumerate(sorted(views))}
    relations: list[dict[str, Any]] = []
    attributes: list[dict[str, Any]] = []
    columns: list[dict[str, Any]] = []
    for name, schema in sorted(views.items()):
        relations.append(_relation(oids[name], name, len(schema), view=name in definitions))
        for number, (field, column) in enumerate(
            zip(schema, wire.columns_of(schema), strict=True), start=1
        ):
            kind = TYPE_OF[column.oid]
            attributes.append(_attribute(oids[name], number, field, kind))
            columns.append(_column(name, number, field, kind))
    info = INFORMATION_SCHEMA
    return {
        "main.pg_namespace": [
            {"oid": oid, "nspname": name, "nspowner": OWNER_OID}
            for oid, name in (
                (PG_CATALOG_OID, "pg_catalog"),
                (PUBLIC_OID, PUBLIC),
                (INFORMATION_SCHEMA_OID, "information_schema"),
            )
        ],
        "main.pg_class": relations,
        "main.pg_attribute": attributes,
        "main.pg_type": [_type(t) for t in _TYPES],
        "main.lake_type_names": [
            {"oid": t.oid, "typname": t.name, "shown": t.shown} for t in _TYPES
        ],
        "main.pg_database": [_database()],
        "main.pg_roles": [_role()],
        "main.pg_user": [
            {
                "usename": OWNER,
                "usesysid": OWNER_OID,
                "usecreatedb": False,
                "usesuper": False,
                "userepl": False,
                "usebypassrls": False,
                "passwd": "********",
            }
        ],
        "main.pg_am": [
            {"oid": 2, "amname": "heap", "amhandler": "heap_tableam_handler", "amtype": "t"},
            {"oid": 403, "amname": "btree", "amhandler": "bthandler", "amtype": "i"},
        ],
        "main.pg_tablespace": [
            {"oid": 1663, "spcname": "pg_default", "spcowner": OWNER_OID},
            {"oid": 1664, "spcname": "pg_global", "spcowner": OWNER_OID},
        ],
        "main.pg_collation": [
            {
                "oid": _DEFAULT_COLLATION,
                "collname": "default",
                "collnamespace": PG_CATALOG_OID,
                "collowner": OWNER_OID,
                "collprovider": "d",
                "collisdeterministic": True,
                "collencoding": -1,
            }
        ],
        "main.pg_views": [
            {
                "schemaname": PUBLIC,
                "viewname": name,
                "viewowner": OWNER,
                "definition": definitions[name],
            }
            for name in sorted(definitions)
        ],
        "main.pg_tables": [
            {
                "schemaname": PUBLIC,
                "tablename": name,
                "tableowner": OWNER,
                "hasindexes": False,
                "hasrules": False,
                "hastriggers": False,
                "rowsecurity": False,
            }
            for name in sorted(views)
            if name not in definitions
        ],
        f"{info}.schemata": [
            {"catalog_name": "lake", "schema_name": schema, "schema_owner": OWNER}
            for schema in ("information_schema", "pg_catalog", PUBLIC)
        ],
        f"{info}.tables": [
            {
                "table_catalog": "lake",
                "table_schema": PUBLIC,
                "table_name": name,
                "table_type": "VIEW" if name in definitions else "BASE TABLE",
                "is_insertable_into": "NO",
                "is_typed": "NO",
            }
            for name in sorted(views)
        ],
        f"{info}.views": [
            {
                "table_catalog": "lake",
                "table_schema": PUBLIC,
                "table_name": name,
                "view_definition": definitions[name],
                "check_option": "NONE",
                "is_updatable": "NO",
                "is_insertable_into": "NO",
                "is_trigger_updatable": "NO",
                "is_trigger_deletable": "NO",
                "is_trigger_insertable_into": "NO",
            }
            for name in sorted(definitions)
        ],
        f"{info}.columns": columns,
    }


def _relation(oid: int, name: str, columns: int, view: bool) -> dict[str, Any]:
    return {
        **{"oid": oid, "relname": name, "relnamespace": PUBLIC_OID, "reltype": 0},
        **{"reloftype": 0, "relowner": OWNER_OID, "relam": 0, "relfilenode": 0},
        **{"reltablespace": 0, "relpages": 0, "reltuples": -1.0, "relallvisible": 0},
        **{"reltoastrelid": 0, "relhasindex": False, "relisshared": False},
        **{"relpersistence": "p", "relkind": "v" if view else "r", "relnatts": columns},
        "relchecks": 0,
        **{"relhasrules": False, "relhastriggers": False, "relhassubclass": False},
        **{"relrowsecurity": False, "relforcerowsecurity": False, "relispopulated": True},
        **{"relreplident": "n", "relispartition": False, "relrewrite": 0},
        **{"relfrozenxid": 0, "relminmxid": 0, "relhasoids": False, "relhaspkey": False},
    }


def _attribute(relation: int, number: int, field: pa.Field, kind: _Type) -> dict[str, Any]:
    return {
        **{"attrelid": relation, "attname": field.name, "atttypid": kind.oid},
        **{"attstattarget": -1, "attlen": kind.length, "attnum": number, "attndims": 0},
        **{"attcacheoff": -1, "atttypmod": -1, "attbyval": kind.length in (1, 2, 4, 8)},
        **{"attalign": kind.align, "attstorage": "x" if kind.length < 0 else "p"},
        **{"attcompression": "", "attnotnull": not field.nullable, "atthasdef": False},
        **{"atthasmissing": False, "attidentity": "", "attgenerated": ""},
        **{"attisdropped": False, "attislocal": True, "attinhcount": 0},
        "attcollation": kind.collation,
    }


def _column(view: str, number: int, field: pa.Field, kind: _Type) -> dict[str, Any]:
    precision = {wire.INT2: 16, wire.INT4: 32, wire.INT8: 64, wire.FLOAT4: 24, wire.FLOAT8: 53}
    return {
        **{"table_catalog": "lake", "table_schema": PUBLIC, "table_name": view},
        **{"column_name": field.name, "ordinal_position": number},
        **{"is_nullable": "YES" if field.nullable else "NO"},
        **{"data_type": "ARRAY" if kind.category == "A" else kind.shown},
        "numeric_precision": precision.get(kind.oid),
        "numeric_precision_radix": 2 if kind.oid in precision else None,
        "numeric_scale": 0 if kind.oid in (wire.INT2, wire.INT4, wire.INT8) else None,
        "datetime_precision": 6 if kind.oid in (wire.TIMESTAMP, wire.TIMESTAMPTZ) else None,
        "collation_name": None,
        **{"udt_catalog": "lake", "udt_schema": "pg_catalog", "udt_name": kind.name},
        **{"dtd_identifier": str(number), "is_self_referencing": "NO", "is_identity": "NO"},
        **{"is_generated": "NEVER", "is_updatable": "NO"},
    }


def _type(kind: _Type) -> dict[str, Any]:
    return {
        **{"oid": kind.oid, "typname": kind.name, "typnamespace": PG_CATALOG_OID},
        **{"typowner": OWNER_OID, "typlen": kind.length},
        **{"typbyval": kind.length in (1, 2, 4, 8), "typtype": "p" if kind.length == -2 else "b"},
        **{"typcategory": kind.category, "typispreferred": False, "typisdefined": True},
        **{"typdelim": ",", "typrelid": 0, "typelem": _ELEMENT_OF.get(kind.oid, 0)},
        **{"typarray": kind.array, "typinput": f"{kind.name}in", "typoutput": f"{kind.name}out"},
        **{"typreceive": f"{kind.name}recv", "typsend": f"{kind.name}send"},
        **{"typalign": kind.align, "typstorage": "x" if kind.length < 0 else "p"},
        **{"typnotnull": False, "typbasetype": 0, "typtypmod": -1, "typndims": 0},
        "typcollation": kind.collation,
    }


def _database() -> dict[str, Any]:
    return {
        **{"oid": DATABASE_OID, "datname": "lake", "datdba": OWNER_OID, "encoding": 6},
        **{"datlocprovider": "c", "datistemplate": False, "datallowconn": True},
        **{"datconnlimit": -1, "datfrozenxid": 0, "datminmxid": 1, "dattablespace": 1663},
        **{"datcollate": "C", "datctype": "C", "datlastsysoid": DATABASE_OID - 1},
    }


def _role() -> dict[str, Any]:
    return {
        **{"rolname": OWNER, "rolsuper": False, "rolinherit": True, "rolcreaterole": False},
        **{"rolcreatedb": False, "rolcanlogin": False, "rolreplication": False},
        **{"rolconnlimit": -1, "rolpassword": "********", "rolbypassrls": False},
        "oid": OWNER_OID,
    }
