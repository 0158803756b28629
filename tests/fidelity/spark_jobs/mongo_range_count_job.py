"""spark-submit job for the fidelity suite: executors read _id ranges from MongoDB with pymongo.

Usage: spark-submit mongo_range_count_job.py <database> <collection> <bounds as comma-separated ints>
The MongoDB URI comes from the MONGOCDC_JOB_MONGODB_URI environment variable (never argv). Each
range [bound_i, bound_i+1) is one Spark partition; the driver prints one line
``RANGE_COUNTS=<json list>`` with the number of documents each executor read, and
``EXECUTOR_PIDS=<n>`` with the number of distinct Python worker processes that did the reading.
"""

import json
import os
import sys

from pyspark.sql import SparkSession


def count_range(index_and_bounds, uri, database, collection):
    from pymongo import MongoClient

    for index, (low, high) in index_and_bounds:
        with MongoClient(uri, serverSelectionTimeoutMS=20000, appname="mongocdc-fidelity-executor") as client:
            cursor = client[database][collection].find({"_id": {"$gte": low, "$lt": high}}, batch_size=100)
            count = sum(1 for _ in cursor)
        yield index, count, os.getpid()


def main():
    database, collection, bounds_text = sys.argv[1], sys.argv[2], sys.argv[3]
    uri = os.environ["MONGOCDC_JOB_MONGODB_URI"]
    bounds = [int(b) for b in bounds_text.split(",")]
    ranges = list(enumerate(zip(bounds, bounds[1:])))
    spark = SparkSession.builder.appName("mongocdc-fidelity-range-count").getOrCreate()
    try:
        rdd = spark.sparkContext.parallelize(ranges, len(ranges))
        results = rdd.mapPartitions(lambda rows: count_range(rows, uri, database, collection)).collect()
    finally:
        spark.stop()
    results.sort()
    print("RANGE_COUNTS=" + json.dumps([count for _, count, _ in results]))
    print("EXECUTOR_PIDS=" + str(len({pid for _, _, pid in results})))


if __name__ == "__main__":
    main()
