"""Prometheus relabelling (`metric_relabel_configs`) over one label dict that includes `__name__`."""

from __future__ import annotations

import re
from collections.abc import Sequence

from gpuwatch.collect.scrapeconfig import LABEL_NAME, Relabel

_GO_TEMPLATE = re.compile(r"\$\$|\$\{(\w+)\}|\$(\w+)")


def expand(template: str, match: re.Match[str]) -> str:
    """Expand `$1`, `${1}`, `$name`, `${name}` (and `$$`) as Go's Regexp.Expand does."""
    if "$" not in template:
        return template

    def one(m: re.Match[str]) -> str:
        ref = m.group(1) or m.group(2)
        if ref is None:
            return "$"
        try:
            value = match.group(int(ref)) if ref.isdigit() else match.group(ref)
        except IndexError:  # no such group: Go expands it to nothing
            return ""
        return value or ""

    return _GO_TEMPLATE.sub(one, template)


def relabel(labels: dict[str, str], rules: Sequence[Relabel]) -> dict[str, str] | None:
    """Apply `rules` in order to `labels` (changed in place); None means the sample is dropped."""
    for rule in rules:
        action = rule.action
        if action in ("replace", "keep", "drop"):
            value = rule.separator.join(labels.get(s, "") for s in rule.source_labels)
            m = rule.regex.match(value)
            if action == "keep":
                if m is None:
                    return None
            elif action == "drop":
                if m is not None:
                    return None
            elif m is not None:
                target = expand(rule.target_label, m)
                if not LABEL_NAME.fullmatch(target):
                    continue
                result = expand(rule.replacement, m)
                if result:
                    labels[target] = result
                else:
                    labels.pop(target, None)
        elif action == "labeldrop":
            for name in [n for n in labels if rule.regex.match(n)]:
                del labels[name]
        elif action == "labelkeep":
            for name in [n for n in labels if n != "__name__" and not rule.regex.match(n)]:
                del labels[name]
        elif action == "labelmap":
            for name, value in list(labels.items()):
                m = rule.regex.match(name)
                if m is not None:
                    labels[expand(rule.replacement, m)] = value
    return labels
