"""The operator that keeps every captured collection as a Delta Lake table: the table apply operator
of the ``delta`` format (:mod:`airflow_provider_mongocdc.operators.table_apply`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from airflow_provider_mongocdc.operators.table_apply import (
    DELTA_ASSET_ALIAS,
    MongoTableApplyOperator,
    delta_alias,
    table_asset,
    table_asset_uri,
)

__all__ = ["DELTA_ASSET_ALIAS", "MongoDeltaApplyOperator", "delta_alias", "table_asset", "table_asset_uri"]


class MongoDeltaApplyOperator(MongoTableApplyOperator):
    """:class:`~airflow_provider_mongocdc.operators.table_apply.MongoTableApplyOperator` of Delta
    Lake tables.

    :param delta: the Delta settings (a mapping or its JSON): ``location`` (local path or
        object-store URI, required), ``conn_id``, ``columns``, ``soft_delete``, ``collections``,
        ``max_batch_events``, ``compact_every``, ``vacuum_every``, ``vacuum_retention``,
        ``fail_on_misfit``, ``follow_every``
        (:class:`~airflow_provider_mongocdc.core.apply.settings.TableSettings`). (templated)
    """

    template_fields: Sequence[str] = (
        *(name for name in MongoTableApplyOperator.template_fields if name != "tables"),
        "delta",
    )
    template_fields_renderers = {**MongoTableApplyOperator.template_fields_renderers, "delta": "json"}
    table_format = "delta"

    def __init__(self, *, delta: Mapping[str, Any] | str, **kwargs: Any):
        super().__init__(tables=delta, **kwargs)

    @property
    def delta(self) -> Mapping[str, Any] | str:
        return self.tables

    @delta.setter
    def delta(self, value: Mapping[str, Any] | str) -> None:
        self.tables = value
