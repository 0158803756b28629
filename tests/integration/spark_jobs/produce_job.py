"""spark-submit job for the harness test: executors produce numbered records to Kafka.

Usage: spark-submit produce_job.py <bootstrap.servers> <topic> <count> <partitions>
"""

import sys

from pyspark.sql import SparkSession


def produce_partition(rows, bootstrap, topic):
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    sent = 0
    for value in rows:
        producer.produce(topic, key=str(value).encode(), value=str(value).encode())
        producer.poll(0)
        sent += 1
    remaining = producer.flush(120)
    if remaining:
        raise RuntimeError(f"{remaining} records not delivered")
    yield sent


def main():
    bootstrap, topic, count, partitions = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    spark = SparkSession.builder.appName("mongocdc-harness-produce").getOrCreate()
    try:
        rdd = spark.sparkContext.parallelize(range(count), partitions)
        sent = rdd.mapPartitions(lambda rows: produce_partition(rows, bootstrap, topic)).sum()
        print(f"HARNESS_SENT={sent}")
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
