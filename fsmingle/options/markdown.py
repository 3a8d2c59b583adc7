"""The option table of ``docs/cli.md``, generated from the rows (kept in sync by ``tests/test_docs.py``)."""

from __future__ import annotations

from .table import OPTIONS


def markdown_table() -> str:
    """The option table of ``docs/cli.md``: flags, value, default, fallbacks, torchrun key, meaning."""
    rows = ["| option | value | default | falls back to | `--rdzv-conf` key | meaning |", "|---|---|---|---|---|---|"]
    for o in OPTIONS:
        flags = ", ".join(f"`{f}`" for f in o.flags)
        value = "" if o.type is bool else f"`{o.type_name}`"
        if o.default_text:
            default = o.default_text
        elif o.type is bool:
            default = "off"
        elif o.default is None:
            default = "—"
        else:
            default = f"{o.default:g}" if isinstance(o.default, float) else str(o.default)
        env = ", ".join(f"`{e}`" for e in o.env) or "—"
        key = f"`{o.conf_key}`" if o.conf_key else "—"
        rows.append(f"| {flags} | {value} | {default} | {env} | {key} | {o.help.replace('|', '/')} |")
    return "\n".join(rows) + "\n"
