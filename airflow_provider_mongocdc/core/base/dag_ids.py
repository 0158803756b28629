"""The DAG ids of a connector: ``mongocdc_<name>_hourly``, ``_resnapshot``, ``_watchdog``; the
connector named ``default`` has the short ids below (links, sensors and the example DAGs use them)."""

from __future__ import annotations

DEFAULT_NAME = "default"
HOURLY = "mongocdc_hourly"
RESNAPSHOT = "mongocdc_resnapshot"
WATCHDOG = "mongocdc_watchdog"


def dag_ids(name: str) -> dict[str, str]:
    """The DAG ids of connector ``name``: ``hourly``, ``resnapshot``, ``watchdog``."""
    base = "mongocdc" if name == DEFAULT_NAME else f"mongocdc_{name}"
    return {kind: f"{base}_{kind}" for kind in ("hourly", "resnapshot", "watchdog")}
