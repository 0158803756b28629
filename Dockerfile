# Airflow 3 with this provider and Spark (pyspark) for docker-compose.yaml: the same image runs
# the Airflow components, the Spark master and the Spark worker, so the Spark version and the
# Python libraries match on the driver and the executors.
FROM apache/airflow:3.3.2-python3.11

USER root
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps curl \
 && rm -rf /var/lib/apt/lists/* \
 && ln -s "$(dirname "$(dirname "$(readlink -f "$(command -v java)")")")" /opt/java
ENV JAVA_HOME=/opt/java

USER airflow
COPY --chown=airflow:root pyproject.toml README.md constraints.txt /opt/mongocdc/
COPY --chown=airflow:root airflow_provider_mongocdc /opt/mongocdc/airflow_provider_mongocdc
COPY --chown=airflow:root spark_apps /opt/mongocdc/spark_apps
RUN pip install --no-cache-dir -c /opt/mongocdc/constraints.txt "/opt/mongocdc[delta,iceberg]"
