"""What a table records of its apply, as Delta application transactions (an app id and a version,
written in the same commit as the rows they cover, read back with the table's state):

- ``mongocdc:<topic>:<partition>``: the next offset of that partition to apply (every record
  before it is in the table);
- ``mongocdc:<topic>:snapshot-generation`` and ``...:snapshot-pending``: the re-snapshot sweep's
  generation and the snapshot under way (:mod:`airflow_provider_mongocdc.core.apply.snapshots`);
  ``...:snapshot-began:<partition>``: where in the topic the generation under way began;
- ``mongocdc:<topic>:undeclared:<column>``: 1 once rows were written while the column was not
  declared (null there), 0 once it was declared again and filled again from ``_doc``;
- ``mongocdc:<topic>:misfits:<column>`` and ``...:misfits-last:<column>``: how many values of a
  declared column did not fit it since the table was created, and in the last run that committed
  (the MongoDB CDC page shows them);
- ``mongocdc:<topic>:topic-id``: the topic's identity (62 bits of its Kafka topic id), so that a
  topic deleted and created again is not taken for the one the positions are in;
- ``mongocdc:<topic>:compacted`` and ``...:vacuumed``: when the table was last compacted and
  vacuumed (epoch seconds), so that maintenance follows its schedule across runs.

A table at the location without the generation's app id was not written by the apply of that topic:
the apply refuses to change it (:func:`check_owner`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from airflow_provider_mongocdc.core.apply.snapshots import NONE
from airflow_provider_mongocdc.core.base.errors import TableError

APP_PREFIX = "mongocdc"


def position_app_id(topic: str, partition: int) -> str:
    return f"{APP_PREFIX}:{topic}:{partition}"


def generation_app_id(topic: str) -> str:
    return f"{APP_PREFIX}:{topic}:snapshot-generation"


def pending_app_id(topic: str) -> str:
    return f"{APP_PREFIX}:{topic}:snapshot-pending"


def began_app_id(topic: str, partition: int) -> str:
    return f"{APP_PREFIX}:{topic}:snapshot-began:{partition}"


def topic_id_app_id(topic: str) -> str:
    return f"{APP_PREFIX}:{topic}:topic-id"


def undeclared_app_id(topic: str, column: str) -> str:
    return f"{APP_PREFIX}:{topic}:undeclared:{column}"


def misfits_app_id(topic: str, column: str) -> str:
    return f"{APP_PREFIX}:{topic}:misfits:{column}"


def last_misfits_app_id(topic: str, column: str) -> str:
    return f"{APP_PREFIX}:{topic}:misfits-last:{column}"


def compacted_app_id(topic: str) -> str:
    return f"{APP_PREFIX}:{topic}:compacted"


def vacuumed_app_id(topic: str) -> str:
    return f"{APP_PREFIX}:{topic}:vacuumed"


@dataclass
class TableState:
    """A table's apply state; ``version`` None: no table yet."""

    topic: str
    version: int | None = None
    positions: dict[int, int] = field(default_factory=dict)  # partition -> next offset to apply
    generation: int = 0
    pending: int = NONE
    compacted_at: int | None = None
    vacuumed_at: int | None = None
    began: dict[int, int] = field(default_factory=dict)  # where the generation under way began
    topic_id: int | None = None  # the topic's identity the positions are in (None: not recorded)
    undeclared: tuple[str, ...] = ()  # the table's columns no longer declared (recorded with each commit)

    @classmethod
    def read(
        cls,
        topic: str,
        version: int | None,
        app_version: Callable[[str], int | None],
        partitions: Iterable[int],
    ) -> TableState:
        """The state of the table at ``version`` (``app_version(app_id)``: the table's application
        transaction version of an app id, or None)."""
        state = cls(topic, version)
        if version is None:
            return state
        for partition in partitions:
            offset = app_version(position_app_id(topic, partition))
            if offset is not None:
                state.positions[partition] = offset
        state.generation = app_version(generation_app_id(topic)) or 0
        state.pending = app_version(pending_app_id(topic)) or NONE
        state.compacted_at = app_version(compacted_app_id(topic))
        state.vacuumed_at = app_version(vacuumed_app_id(topic))
        state.topic_id = app_version(topic_id_app_id(topic))
        if state.pending != NONE:
            for partition in partitions:
                offset = app_version(began_app_id(topic, partition))
                if offset is not None:
                    state.began[partition] = offset
        return state

    @property
    def exists(self) -> bool:
        return self.version is not None

    def versions(self) -> dict[str, int]:
        """The app ids and versions an apply commit records."""
        versions = {
            position_app_id(self.topic, partition): offset for partition, offset in self.positions.items()
        }
        versions[generation_app_id(self.topic)] = self.generation
        versions[pending_app_id(self.topic)] = self.pending
        if self.pending != NONE:
            for partition, offset in self.began.items():
                versions[began_app_id(self.topic, partition)] = offset
        if self.topic_id is not None:
            versions[topic_id_app_id(self.topic)] = self.topic_id
        for column in self.undeclared:
            versions[undeclared_app_id(self.topic, column)] = 1
        return versions


def check_owner(
    uri: str, topic: str, version: int | None, app_version: Callable[[str], int | None], description: str
) -> None:
    """Refuse a table the apply of ``topic`` did not write (before anything changes)."""
    if version is None or app_version(generation_app_id(topic)) is not None:
        return
    raise TableError(
        f"The table at {uri} was not written by the apply of the topic {topic!r}",
        cause=f"it exists (version {version}) without the apply's record of that topic"
        + (f"; its description says: {description}" if description else "")
        + ": it was written by something else, or by the apply of another connector or topic",
        fix="choose another 'location' for the connector's tables, or move that table away; the apply "
        "changes only tables it created",
    )
