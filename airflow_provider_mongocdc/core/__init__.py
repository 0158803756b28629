"""Pure CDC logic: no Airflow and no Spark imports here.

Hooks, operators, sensors, triggers and the Spark apps are thin adapters over this package.
"""
