"""`gpuwatch dashboards export`: the dashboard's pages as Grafana dashboard JSON, one file each."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def _text(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False) + "\n"


def run_export(output: str | None) -> int:
    """Write `<uid>.json` per dashboard into the directory `output` (default: the current one; `-`:
    one JSON list on stdout); return 0, or 2 where the directory cannot be written."""
    from gpuwatch.web.dash.grafana import dashboards

    found = dashboards()
    if output == "-":
        sys.stdout.write(_text(found))
        return 0
    folder = Path(output or ".")
    try:
        if not folder.is_dir():
            folder.mkdir()  # one level: a mistyped parent is an error, not a new tree
        for d in found:
            (folder / f"{d['uid']}.json").write_text(_text(d), encoding="utf-8")
    except OSError as e:
        print(f"gpuwatch: cannot write dashboards into {folder}: {e.strerror or e}", file=sys.stderr)
        return 2
    names = ", ".join(f"{d['uid']}.json" for d in found)
    print(f"{folder}: {len(found)} Grafana dashboards written ({names})", file=sys.stderr)
    return 0
