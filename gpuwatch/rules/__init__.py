"""Alerting and recording rules in Prometheus's rule-file format: load, evaluate, render, manage."""

from __future__ import annotations

from gpuwatch.rules.load import Group, Rule, RuleFileError, builtin_path, load_files, load_groups

__all__ = ["Group", "Rule", "RuleFileError", "builtin_path", "load_files", "load_groups"]
