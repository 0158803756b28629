"""The README's shell commands as a user copies them: the setup of the example DAGs' connector
``default`` (between ``<!-- setup:start -->`` and ``<!-- setup:end -->``) and the ``mongocdc``
commands of its Operations section."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
# The README's example values, which the tests replace by their servers and a topic prefix of their own.
README_MONGO_URI = "mongodb://mongo1:27017/?replicaSet=rs0"
README_KAFKA = "broker1:9092"
README_PREFIX = '"topic.prefix": "shop"'


def setup_commands() -> list[str]:
    text = README.read_text()
    match = re.search(r"<!-- setup:start -->\s*```bash\n(.*?)```\s*<!-- setup:end -->", text, re.S)
    assert match, "README.md has no setup block between <!-- setup:start --> and <!-- setup:end -->"
    commands = [line.strip() for line in match.group(1).splitlines() if line.strip()]
    assert commands and all(command.startswith("airflow ") for command in commands), commands
    return commands


def substitute(commands: list[str], values: dict[str, str]) -> list[str]:
    """``commands`` with each README example value replaced; each must occur exactly once."""
    joined = "\n".join(commands)
    for old, new in values.items():
        assert joined.count(old) == 1, f"the README setup should name {old!r} once:\n{joined}"
        joined = joined.replace(old, new)
    return joined.splitlines()


def operations_commands() -> list[list[str]]:
    """Every ``mongocdc`` command of the README's "Operations" section, in order, as argv lists
    (continued lines joined, comments left out)."""
    text = README.read_text()
    start = text.index("\n## Operations\n")
    section = text[start : text.index("\n## ", start + 1)]
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", section, re.S):
        lines = [line for line in block.splitlines() if not line.lstrip().startswith("#")]
        for command in "\n".join(lines).replace("\\\n", " ").splitlines():
            if command.strip().startswith("mongocdc "):
                commands.append(shlex.split(command))
    assert commands, "README.md's Operations section has no mongocdc command"
    return commands
