"""spark-submit job: an executor imports every module of ``airflow_provider_mongocdc.core`` and reports
the file each one came from (the provider's code archive, shipped with ``--py-files``).

Usage: spark-submit --py-files <archive> import_core_job.py <result.json>
"""

import json
import sys

from pyspark.sql import SparkSession


def import_everything(_rows):
    import importlib
    import pkgutil

    import airflow_provider_mongocdc.core as core

    found = {}
    for info in pkgutil.walk_packages(core.__path__, "airflow_provider_mongocdc.core."):
        found[info.name] = importlib.import_module(info.name).__file__
    yield found


def main():
    spark = SparkSession.builder.appName("mongocdc-import-core").getOrCreate()
    try:
        (found,) = spark.sparkContext.parallelize([0], 1).mapPartitions(import_everything).collect()
    finally:
        spark.stop()
    with open(sys.argv[1], "w", encoding="utf-8") as out:
        json.dump(found, out)


if __name__ == "__main__":
    main()
