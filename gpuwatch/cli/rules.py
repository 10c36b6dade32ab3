"""`gpuwatch rules export`: the active rules as one Prometheus rule file, on stdout or into a file."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

from gpuwatch.app.build import configured_rule_groups
from gpuwatch.app.config import load
from gpuwatch.core.errors import ConfigError
from gpuwatch.rules.load import RuleFileError
from gpuwatch.rules.pack import export_text


def run_export(config: Path | None, output: Path | None, env: Mapping[str, str]) -> int:
    """Write the rules; return 0, 1 for a bad rule file, 2 for a bad setting or an unwritable output."""
    try:
        settings = load(config, env)
    except ConfigError as e:
        print(f"gpuwatch: {e}", file=sys.stderr)
        return 2
    try:
        groups = configured_rule_groups(settings)
    except RuleFileError as e:
        print("gpuwatch: rule_files: " + "; ".join(e.errors), file=sys.stderr)
        return 1
    text = export_text(groups)
    if output is None:
        sys.stdout.write(text)
        return 0
    try:
        output.write_text(text, encoding="utf-8")
    except OSError as e:
        print(f"gpuwatch: cannot write {output}: {e.strerror or e}", file=sys.stderr)
        return 2
    print(f"{output}: {sum(len(g.rules) for g in groups)} rules written", file=sys.stderr)
    return 0
