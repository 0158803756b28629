"""spark-submit entry points (installed as ``airflow_provider_mongocdc.spark_apps``)."""
