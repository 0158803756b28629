"""The MongoDB CDC page of the Airflow UI and its JSON API (an Airflow plugin of the API server).

The plugin mounts the FastAPI app of :mod:`airflow_provider_mongocdc.plugins.health_api` at
``/mongocdc`` (``[api] base_url``'s path first) and adds two views to the UI: *MongoDB CDC* in the
navigation bar (every connector) and a *MongoDB CDC* tab on each DAG's page (the connector of that
DAG). The app is imported only when the API server asks for it, so the scheduler and the workers,
which load the same plugins, do not import the API server's modules. Loading the plugin registers
the re-snapshot form's Collections rule (:mod:`airflow_provider_mongocdc.resnapshot_form`) with
the JSON Schema checks the API server runs when Trigger is pressed.
"""

from __future__ import annotations

from typing import Any

from airflow.plugins_manager import AirflowPlugin

from airflow_provider_mongocdc.plugins.health_urls import URL_PREFIX, page_href
from airflow_provider_mongocdc.resnapshot_form import register

# The API server validates the re-snapshot form's conf: its Collections rule in words.
register()


class MongoCdcHealthPlugin(AirflowPlugin):
    """Every connector's health at a glance: positions and lag, oplog headroom, runs, lease, pool."""

    name = "mongocdc_health"
    external_views = [
        {
            "name": "MongoDB CDC",
            "href": page_href(),
            "destination": "nav",
            "url_route": "mongocdc",
        },
        {
            "name": "MongoDB CDC",
            "href": page_href("?dag_id={DAG_ID}"),
            "destination": "dag",
            "url_route": "mongocdc-connector",
        },
    ]

    @property
    def fastapi_apps(self) -> list[dict[str, Any]]:  # type: ignore[override]
        from airflow_provider_mongocdc.plugins.health_api import app

        return [{"app": app, "url_prefix": URL_PREFIX, "name": "MongoDB CDC health"}]
