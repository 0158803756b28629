"""The table formats' adapters of the apply (:class:`~airflow_provider_mongocdc.core.apply.run.TableStore`):
Delta Lake through delta-rs and Apache Iceberg through pyiceberg, one module each, beside what they
share of Arrow. They import their library when used; core/apply imports neither."""
