"""The generated property reference: the Markdown table of every property, and its refresh in a
document (``python -m airflow_provider_mongocdc.core.config.connector --write-docs <doc>``)."""

from __future__ import annotations

from airflow_provider_mongocdc.core.config.compat import (
    ALIASES,
    IGNORED,
    IGNORED_PREFIXES,
    UNSUPPORTED,
    UNSUPPORTED_PREFIXES,
)
from airflow_provider_mongocdc.core.config.properties import PROPERTIES

DOCS_BEGIN = (
    "<!-- BEGIN GENERATED PROPERTY TABLE (python -m airflow_provider_mongocdc.core.config.connector) -->"
)
DOCS_END = "<!-- END GENERATED PROPERTY TABLE -->"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_property_table() -> str:
    """The Markdown reference table of every property (the generated part of the docs)."""
    lines = [DOCS_BEGIN, "", "| Property | Default | Origin | Meaning |", "|---|---|---|---|"]
    for prop in PROPERTIES:
        default = prop.default_for_docs()
        if prop.default_text is None and default:
            default = f"`{default}`"
        if prop.required:
            default = "(required)"
        allowed = " Allowed: " + ", ".join(f"`{a}`" for a in prop.allowed) + "." if prop.allowed else ""
        origin = {"debezium": "Debezium", "kafka-connect": "Kafka Connect"}.get(prop.origin, "this connector")
        lines.append(f"| `{prop.name}` | {_cell(default)} | {origin} | {_cell(prop.description + allowed)} |")
    lines += ["", "Deprecated names accepted with a warning:", ""]
    for alias, (canonical, _) in ALIASES.items():
        lines.append(f"- `{alias}` → `{canonical}`")
    lines += ["", "Accepted and ignored, with a warning saying why:", ""]
    for name, reason in IGNORED.items():
        lines.append(f"- `{name}`: {reason}")
    for prefix, reason in IGNORED_PREFIXES.items():
        lines.append(f"- `{prefix}*`: {reason}")
    lines += ["", "Refused with an error (they would change the output or carry secrets):", ""]
    for name, reason in UNSUPPORTED.items():
        lines.append(f"- `{name}`: {reason}")
    for prefix, reason in UNSUPPORTED_PREFIXES.items():
        lines.append(f"- `{prefix}*`: {reason}")
    lines += ["", DOCS_END]
    return "\n".join(lines)


def sync_docs(path: str) -> bool:
    """Rewrite the generated table in ``path``; returns whether the file changed."""
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    start, end = text.index(DOCS_BEGIN), text.index(DOCS_END) + len(DOCS_END)
    updated = text[:start] + render_property_table() + text[end:]
    if updated != text:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(updated)
    return updated != text


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "--write-docs":
        changed = sync_docs(argv[1])
        print(f"{argv[1]}: {'updated' if changed else 'already in sync'}")
        return 0
    print(render_property_table())
    return 0
