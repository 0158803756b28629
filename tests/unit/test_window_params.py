"""The window's run parameters: an idle timeout that would give up before an idle MongoDB's next
periodic no-op is refused with the cause and the fix."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from airflow_provider_mongocdc.core.base.errors import ConfigError
from airflow_provider_mongocdc.core.window.params import WindowParams

pytestmark = pytest.mark.unit

NOW = datetime(2026, 5, 1, 10, 0, tzinfo=timezone.utc)


@pytest.mark.parametrize("idle", [5, 10, 19.5])
def test_an_idle_timeout_below_twice_the_noop_interval_is_refused(idle):
    with pytest.raises(ConfigError) as info:
        WindowParams(NOW, idle_timeout_s=idle)
    message = str(info.value)
    assert f"idle_timeout_s={idle!r}" in message
    assert "no-op" in message and "10 s" in message
    assert "at least 20" in message


def test_the_default_and_the_floor_are_accepted():
    assert WindowParams(NOW).idle_timeout_s == 30
    assert WindowParams(NOW, idle_timeout_s=20).idle_timeout_s == 20
    assert (
        WindowParams.from_params({"window_end": "2026-05-01T10:00:00Z", "idle_timeout_s": 20}).idle_timeout_s
        == 20
    )
    with pytest.raises(ConfigError):
        WindowParams.from_params({"window_end": "2026-05-01T10:00:00Z", "idle_timeout_s": 5})
