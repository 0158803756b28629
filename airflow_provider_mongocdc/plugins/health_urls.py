"""Addresses of the MongoDB CDC page and of the Airflow UI pages it links to, under ``[api]
base_url``'s path (``/`` when Airflow is served at the root)."""

from __future__ import annotations

from urllib.parse import quote, urlsplit

URL_PREFIX = "/mongocdc"


def base_path() -> str:
    """The path of ``[api] base_url``, ending in ``/``."""
    from airflow.configuration import conf

    path = urlsplit(conf.get("api", "base_url", fallback="") or "/").path or "/"
    return path if path.endswith("/") else path + "/"


def page_href(query: str = "") -> str:
    """The MongoDB CDC page (``query`` appended, e.g. ``?dag_id={DAG_ID}``)."""
    return f"{base_path()}{URL_PREFIX.strip('/')}/{query}"


def ui_url(*parts: str, query: str = "") -> str:
    """A page of the Airflow UI: ``ui_url("dags", dag_id)``."""
    path = "/".join(quote(part, safe="") for part in parts)
    return f"{base_path()}{path}" + (f"?{query}" if query else "")


def task_url(dag_id: str, run_id: str, task_id: str, try_number: int | None = None) -> str:
    """A task instance's page in the UI (its log)."""
    query = f"try_number={try_number}" if try_number else ""
    return ui_url("dags", dag_id, "runs", run_id, "tasks", task_id, query=query)
