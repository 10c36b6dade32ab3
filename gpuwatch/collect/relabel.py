"""Prometheus relabelling (`metric_relabel_configs`) over one label dict that includes `__name__`."""

from __future__ import annotations

from collections.abc import Sequence

from gpuwatch.collect.scrapeconfig import LABEL_NAME, Relabel
from gpuwatch.core.regex import expand


def relabel(labels: dict[str, str], rules: Sequence[Relabel]) -> dict[str, str] | None:  # noqa: C901 - one branch per relabel action, as Prometheus's own switch
    """Apply `rules` in order to `labels` (changed in place); None means the sample is dropped."""
    for rule in rules:
        action = rule.action
        if action in ("replace", "keep", "drop"):
            value = rule.separator.join(labels.get(s, "") for s in rule.source_labels)
            m = rule.regex.search(value)
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
            for name in [n for n in labels if rule.regex.search(n)]:
                del labels[name]
        elif action == "labelkeep":
            for name in [n for n in labels if n != "__name__" and not rule.regex.search(n)]:
                del labels[name]
        elif action == "labelmap":
            for name, value in list(labels.items()):
                m = rule.regex.search(name)
                if m is not None:
                    labels[expand(rule.replacement, m)] = value
    return labels
