"""Relabelling as Prometheus does it: anchored regexes, Go-style `$1`/`${name}` expansion, every action."""

from __future__ import annotations

import re

from gpuwatch.collect.relabel import expand, relabel
from gpuwatch.collect.scrapeconfig import parse_scrape_configs


def rules(*entries: dict[str, object]):  # type: ignore[no-untyped-def]
    (job,) = parse_scrape_configs([{"job_name": "j", "metric_relabel_configs": list(entries)}])
    return job.metric_relabel_configs


def test_expand_follows_go() -> None:
    m = re.match(r"(?P<model>\w+)-(\d+)", "llama-7")
    assert m is not None
    assert expand("$1/$2", m) == "llama/7"
    assert expand("${model}_x", m) == "llama_x"
    assert expand("$model_x", m) == "", "Go reads $model_x as the (missing) group 'model_x'"
    assert expand("$$1 $9", m) == "$1 "
    assert expand("plain", m) == "plain"


def test_regex_is_anchored() -> None:
    labels = {"__name__": "vllm:x_total", "a": "1"}
    assert (
        relabel(dict(labels), rules({"source_labels": ["__name__"], "regex": "x_total", "action": "keep"}))
        is None
    )
    assert relabel(
        dict(labels), rules({"source_labels": ["__name__"], "regex": ".*x_total", "action": "keep"})
    )


def test_replace_with_empty_result_deletes_the_label() -> None:
    out = relabel(
        {"__name__": "m", "a": "1"}, rules({"source_labels": ["b"], "regex": "(.*)", "target_label": "a"})
    )
    assert out == {"__name__": "m"}


def test_replace_without_match_changes_nothing() -> None:
    out = relabel(
        {"__name__": "m", "a": "1"},
        rules({"source_labels": ["a"], "regex": "2", "target_label": "a", "replacement": "two"}),
    )
    assert out == {"__name__": "m", "a": "1"}


def test_labelkeep_and_labelmap() -> None:
    out = relabel(
        {"__name__": "m", "model_name": "x", "engine": "0", "pod": "p"},
        rules(
            {"regex": "model_name|engine", "action": "labelkeep"},
            {"regex": "model_(.*)", "action": "labelmap", "replacement": "llm_$1"},
        ),
    )
    assert out == {"__name__": "m", "model_name": "x", "engine": "0", "llm_name": "x"}


def test_drop_on_joined_sources() -> None:
    r = rules({"source_labels": ["a", "b"], "separator": "/", "regex": "1/2", "action": "drop"})
    assert relabel({"__name__": "m", "a": "1", "b": "2"}, r) is None
    assert relabel({"__name__": "m", "a": "1", "b": "3"}, r) is not None
