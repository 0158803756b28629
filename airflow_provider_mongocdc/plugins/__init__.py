"""Airflow plugins of the provider (loaded by the scheduler, not by the tasks)."""
