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


def test_open_windows_settings_their_defaults_and_what_the_application_gets():
    from airflow_provider_mongocdc.core.window.params import OpenSettings

    defaults = OpenSettings.from_entry({})
    assert (defaults.idle_s, defaults.max_open_s, defaults.commit_interval_s) == (30, 3000, 1)
    assert OpenSettings.from_entry(True) == defaults
    given = OpenSettings.from_entry({"idle": "45s", "max_open": "20min", "commit_interval": 0.5})
    assert given.to_entry() == {"idle": 45, "max_open": 1200, "commit_interval": 0.5}
    params = WindowParams.from_params({"window_end": "2026-05-01T10:00:00Z", **given.to_params()})
    assert params.open and (params.open_idle_s, params.max_open_s, params.commit_interval_s) == (
        45,
        1200,
        0.5,
    )
    assert WindowParams.from_params(params.to_params()) == params  # as the Spark task gets them
    bounded = WindowParams.from_params({"window_end": "2026-05-01T10:00:00Z"})
    assert not bounded.open and bounded.commit_interval_s == 60  # the clock alone: as before


def test_every_bad_open_value_is_named_at_once():
    from airflow_provider_mongocdc.core.window.params import OpenSettings

    with pytest.raises(ConfigError) as info:
        OpenSettings.from_entry({"idle": 0, "max_open": "later", "commit_interval": 90})
    problems = [str(problem) for problem in info.value.problems]
    assert len(problems) == 3
    assert problems[0].startswith("idle must be longer than 0")
    assert problems[1].startswith("max_open must be a duration, got 'later'")
    assert problems[2].startswith("commit_interval must lie between 0.1 s and 60 s, got 90 s")
    with pytest.raises(ConfigError, match="unknown key"):
        OpenSettings.from_entry({"idle_time": 5})
    with pytest.raises(ConfigError, match=r"idle \(600 s\) is longer than max_open \(60 s\)"):
        WindowParams(NOW, open_idle_s=600, max_open_s=60)
