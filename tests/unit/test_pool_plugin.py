"""The pool listener names the connector of a DAG of the connector DAG factory in the pools it creates
(the e2e test tests/e2e/test_connector_pools.py runs the listener in a real scheduler)."""

from __future__ import annotations

import pytest

from airflow_provider_mongocdc.core.base.dag_ids import dag_ids
from airflow_provider_mongocdc.plugins.pools import connector_of, pool_description

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("name", ["default", "orders", "team_a", "a_hourly", "x_resnapshot_2"])
def test_connector_is_read_back_from_the_factory_dag_ids(name):
    ids = dag_ids(name)
    assert connector_of(ids["hourly"]) == name
    assert connector_of(ids["resnapshot"]) == name
    # The watchdog runs no task in the pool.
    assert connector_of(ids["watchdog"]) is None


def test_pool_description_names_the_connector_or_else_the_dag():
    assert pool_description(["mongocdc_orders_resnapshot", "mongocdc_orders_hourly"]) == (
        "MongoDB CDC connector orders: one snapshot or window at a time"
    )
    assert pool_description(["mongocdc_hourly"]) == (
        "MongoDB CDC connector default: one snapshot or window at a time"
    )
    assert (
        pool_description(["shop_cdc"])
        == "MongoDB CDC tasks of DAG shop_cdc: one snapshot or window at a time"
    )
