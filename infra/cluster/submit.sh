#!/usr/bin/env bash
# Submit `tenant-windows run` to a standalone Spark cluster with spark-submit, in client mode: the
# driver runs here, next to conf/, and commits to the lake with delta-rs.
#
#   infra/cluster/submit.sh spark://HOST:7077 [tenant-windows run flags ...]
#
# The nodes need `python3` on their PATH with pyspark (the driver's version), pandas and pyarrow,
# as every PySpark image has; the rest is shipped from here (infra/cluster/ship.py): this
# project's code on --py-files, the executors' dependencies on --archives. The checkpoint dir
# must be a path every node reads and writes (HDFS, NFS/EFS, DBFS); the tenant config snapshots
# live under it. More spark-submit options go in SPARK_SUBMIT_EXTRA (e.g. "--executor-memory 4g").
#
# SPARK_LOCAL_IP: this machine's address as the executors reach it (default loopback, for a
# cluster on this machine). PYSPARK_PYTHON: the nodes' interpreter if not `python3`.
# SPARK_SUBMIT: the cluster's own spark-submit (default: the one pyspark installs in .venv).
set -euo pipefail
cd "$(dirname "$0")/../.."
master="${1:?usage: infra/cluster/submit.sh spark://HOST:PORT [tenant-windows run flags ...]}"
shift
venv_bin="$PWD/.venv/bin"
[ -x "$venv_bin/python" ] || bash infra/setup.sh
spark_submit="${SPARK_SUBMIT:-$venv_bin/spark-submit}"

ship_output="$("$venv_bin/python" -m infra.cluster.ship)"
mapfile -t ship_options <<<"$ship_output"
read -r -a extra_options <<<"${SPARK_SUBMIT_EXTRA:-}"

export SPARK_LOCAL_IP="${SPARK_LOCAL_IP:-127.0.0.1}"
export PYSPARK_PYTHON="${PYSPARK_PYTHON:-python3}"
export PYSPARK_DRIVER_PYTHON="$venv_bin/python"
# The driver starts Python workers too (the Kafka source's offset planning), by the executors'
# name: here `python3` must be this virtualenv's.
export PATH="$venv_bin:$PATH"
exec "$spark_submit" --master "$master" --deploy-mode client \
  --conf "spark.driver.host=$SPARK_LOCAL_IP" --conf "spark.driver.bindAddress=$SPARK_LOCAL_IP" \
  --driver-java-options -Xss16m \
  "${ship_options[@]}" "${extra_options[@]}" infra/cli/main.py run "$@"
