"""Prometheus's remote-write sender compliance suite, case by case, against `gpuwatch serve`.

The cases are those of prometheus/compliance (`remotewrite/sender/cases/*.go`): each serves a page
and checks what a receiver got. Here ONE gpuwatch (no GPUs, no demo sources) scrapes every page every
second through `scrape_configs`, one job per case, and writes to ONE receiver in this process under
four destinations: `main` (every case but these three), `slow` (the ordering case: its first requests
are answered after 1-2 s), `r500` (its first batch answered 500) and `r400` (its first batch answered
400). Pages are made by the real `prometheus_client` (a registry and `generate_latest`), or written by
hand where the case is an invalid or odd page. Each case asserts what the suite asserts on the
samples of its job, polling the receiver until a deadline (never sleeping for time to pass).

Where these cases depart from the suite's letter: a histogram's `le` is the page's text, and
`prometheus_client` writes `le="1.0"` where the suite's Go page writes `le="1"`; and samples are
checked in time order per series (what the specification asks), not across series as the suite's
timestamp case does: a batch holding several scrapes carries each series' samples together. And a
scrape that times out on a busy machine (1 s) writes staleness markers for its target's series, as
Prometheus does: the cases on values leave out markers at the time of a failed scrape (`Lab.scraped`).
"""

from __future__ import annotations

import itertools
import re
import time
from pathlib import Path

import pytest

from tests.rwcompliance import (
    JOBS,
    ORDERING_SERIES,
    SLOW_REQUESTS,
    Lab,
    Labels,
    Sample,
    is_stale,
    run_lab,
    select,
)

pytestmark = pytest.mark.slow


# -- the cases -----------------------------------------------------------------------------------------


def values(samples: list[Sample]) -> list[float]:
    return [v for _, _, v in samples]


def case_counter(lab: Lab) -> None:
    lab.wait(lambda: len(lab.scraped("counter", "counter_total")) >= 3, "fewer than 3 counter samples")
    got = values(lab.scraped("counter", "counter_total"))
    if lab.failed_scrapes("counter"):  # a scrape that timed out was still served: its count is skipped
        assert got[0] == 0.0 and got == sorted(set(got)) and all(v.is_integer() for v in got)
    else:
        assert got == [float(i) for i in range(len(got))]  # each scrape once, in order, from the first


def case_gauge(lab: Lab) -> None:
    lab.wait(lambda: lab.taken("gauge", "now"), "no `now` sample")
    for _, t, v in lab.scraped("gauge", "now"):
        assert abs(t - v) / t < 0.01


def case_histogram(lab: Lab) -> None:
    lab.wait(lambda: lab.taken("histogram", "histogram_count"), "no histogram_count sample")
    count = lab.scraped("histogram", "histogram_count")
    for name, labels, want in [
        ("histogram_bucket", {"le": "1.0"}, 1.0),
        ("histogram_bucket", {"le": "2.0"}, 2.0),
        ("histogram_bucket", {"le": "+Inf"}, 2.0),
        ("histogram_sum", {}, 3.0),
        ("histogram_count", {}, 2.0),
    ]:
        got = lab.scraped("histogram", name, **labels)
        assert values(got) == [want] * len(got) and len(got) >= len(count), (name, labels)


def case_summary(lab: Lab) -> None:
    lab.wait(lambda: lab.taken("summary", "summary_count"), "no summary_count sample")
    count = lab.scraped("summary", "summary_count")
    for name, labels, want in [
        ("summary", {"quantile": "0.5"}, 2.0),
        ("summary", {"quantile": "0.9"}, 3.0),
        ("summary", {"quantile": "0.99"}, 3.0),
        ("summary_sum", {}, 6.0),
        ("summary_count", {}, 3.0),
    ]:
        got = lab.scraped("summary", name, **labels)
        assert values(got) == [want] * len(got) and len(got) >= len(count), (name, labels)


def case_up(lab: Lab) -> None:
    lab.wait(lambda: 1.0 in values(lab.taken("up", "up")), 'no up{job="up"} sample of 1')
    assert set(values(lab.taken("up", "up"))) <= {0.0, 1.0}  # 0: a scrape timed out on a busy machine


def case_invalid_page_is_up_0(lab: Lab) -> None:
    lab.wait(lambda: lab.taken("invalid", "up"), 'no up{job="invalid"} sample')
    assert set(values(lab.taken("invalid", "up"))) == {0.0}


def case_job_label(lab: Lab) -> None:
    lab.wait(lambda: lab.taken("job_label", "gauge"), 'no gauge{job="job_label"} sample')
    assert set(values(lab.scraped("job_label", "gauge"))) == {42.0}


def case_instance_label(lab: Lab) -> None:
    lab.wait(lambda: lab.taken("instance_label", "gauge"), 'no gauge{job="instance_label"} sample')
    assert set(values(lab.scraped("instance_label", "gauge"))) == {42.0}
    scraped = [s for s in lab.receiver.taken("main") if dict(s[0]).get("job") in (*JOBS, "gone")]
    assert scraped
    for labels, _, _ in scraped:
        assert re.fullmatch(r"127\.0\.0\.1:\d+", dict(labels).get("instance", "")), labels


def case_sorted_labels(lab: Lab) -> None:
    lab.wait(lambda: lab.taken("sorted_labels", "test"), 'no test{job="sorted_labels"} sample')
    got = lab.scraped("sorted_labels", "test")
    # gpuwatch names the node on every series sent (`Hostname`, the GPUWATCH_HOSTNAME above), in order.
    want = (
        ("Hostname", "lab"),
        ("__name__", "test"),
        ("a", "1"),
        ("b", "2"),
        ("instance", lab.address),
        ("job", "sorted_labels"),
    )
    assert {labels for labels, _, _ in got} == {want}
    assert set(values(got)) == {1.0}


def case_repeated_labels_fail_the_scrape(lab: Lab) -> None:
    lab.wait(lambda: lab.taken("repeated_labels", "up"), 'no up{job="repeated_labels"} sample')
    assert set(values(lab.taken("repeated_labels", "up"))) == {0.0}
    assert lab.taken("repeated_labels", "test") == []


def case_empty_label_is_dropped(lab: Lab) -> None:
    lab.wait(lambda: lab.taken("empty_labels", "test"), 'no test{job="empty_labels"} sample')
    got = lab.scraped("empty_labels", "test")
    assert all("a" not in dict(labels) for labels, _, _ in got)
    assert set(values(got)) == {1.0}


def case_missing_name_fails_the_scrape(lab: Lab) -> None:
    lab.wait(lambda: lab.taken("name_label", "up"), 'no up{job="name_label"} sample')
    assert set(values(lab.taken("name_label", "up"))) == {0.0}
    assert select(lab.receiver.taken("main"), label="value") == []


def case_honor_labels_false_exports_the_page_job(lab: Lab) -> None:
    lab.wait(lambda: lab.taken("honor_labels", "test"), 'no test{job="honor_labels"} sample')
    got = lab.scraped("honor_labels", "test")
    assert got == lab.scraped("honor_labels", "test", exported_job="original", exported_instance="foo")
    assert set(values(got)) == {1.0}


def case_every_label_set_sorted_unique_nonempty_and_named(lab: Lab) -> None:
    lab.wait(lambda: lab.taken("honor_labels", "test"), "nothing from the label cases")
    for request in lab.receiver.answered():
        for labels, _, _ in request.samples:
            names = [k for k, _ in labels]
            assert names == sorted(names) and len(set(names)) == len(names), labels
            assert "__name__" in names and all(v for _, v in labels), labels


def case_staleness_marker_when_a_series_goes(lab: Lab) -> None:
    def marked() -> bool:
        return any(is_stale(v) for v in values(lab.taken("staleness", "stale")))

    lab.wait(marked, 'no staleness marker for stale{job="staleness"}')
    got = values(lab.taken("staleness", "stale"))
    assert got[0] == 0.0 and is_stale(got[1]) and len(got) == 2  # once, then its marker, then nothing


def case_staleness_markers_when_a_target_goes(lab: Lab) -> None:
    def marked() -> bool:
        return any(is_stale(v) for v in values(lab.taken("gone", "gone")))

    lab.wait(marked, 'no staleness marker for gone{job="gone"} after its target went away')
    got = values(lab.taken("gone", "gone"))
    assert got[:2] == [0.0, 0.0] and is_stale(got[2])
    assert values(lab.taken("gone", "up"))[:3] == [1.0, 1.0, 0.0]


def case_timestamps_within_the_run(lab: Lab) -> None:
    lab.wait(lambda: len(lab.taken("timestamp", "gauge")) >= 2, 'fewer than 2 gauge{job="timestamp"} samples')
    end_ms = int(time.time() * 1000)
    for request in lab.receiver.answered():
        for labels, t, _ in request.samples:
            assert lab.start_ms < t < end_ms, (labels, t, lab.start_ms, end_ms)
    assert set(values(lab.scraped("timestamp", "gauge"))) == {42.0}


def case_headers(lab: Lab) -> None:
    lab.wait(lambda: lab.receiver.answered(), "no request")
    assert lab.receiver.errors == []
    for request in lab.receiver.answered():
        h = {k.lower(): v for k, v in request.headers.items()}
        assert h.get("content-encoding") == "snappy"
        assert h.get("content-type") == "application/x-protobuf"
        assert h.get("x-prometheus-remote-write-version") == "0.1.0"
        assert h.get("user-agent", "").startswith("gpuwatch/")
        assert h.get("x-scope-orgid") == ("lab" if request.destination == "main" else None)


def case_series_in_time_order_under_a_slow_receiver(lab: Lab) -> None:
    """The ordering case: 1,000 series, the first requests answered after 1-2 s each; every series'
    samples in strictly increasing time, and none lost: once caught up, each series has the time of
    every successful scrape (`up` 1; a scrape that timed out on a busy machine brings none)."""
    missing: dict[Labels, set[int]] = {}

    def caught_up() -> bool:
        if sum(r.destination == "slow" for r in lab.receiver.answered()) < SLOW_REQUESTS + 3:
            return False
        scrapes = {t for _, t, v in lab.taken("ordering", "up", destination="slow") if v == 1.0}
        missing.clear()
        for labels, ts in per_series(lab.taken("ordering", "test", destination="slow")).items():
            if scrapes - set(ts):
                missing[labels] = scrapes - set(ts)
        return len(scrapes) >= 5 and not missing

    try:
        lab.wait(caught_up, "the slow destination did not catch up")
    except AssertionError as exc:
        raise AssertionError(
            f"{len(missing)} series lack samples, e.g. {list(missing.items())[:3]}; {exc}"
        ) from None
    tests = lab.taken("ordering", "test", destination="slow")
    assert len(per_series(tests)) == ORDERING_SERIES
    for labels, ts in per_series(lab.receiver.taken("slow")).items():
        assert increasing(ts), (labels, ts)
    assert all(v == 1.0 or is_stale(v) for v in values(tests))  # stale: after a scrape that failed


def increasing(ts: list[int]) -> bool:
    return all(a < b for a, b in itertools.pairwise(ts))


def per_series(samples: list[Sample]) -> dict[Labels, list[int]]:
    out: dict[Labels, list[int]] = {}
    for labels, t, _ in samples:
        out.setdefault(labels, []).append(t)
    return out


def case_every_series_in_time_order(lab: Lab) -> None:
    lab.wait(lambda: len(lab.receiver.taken("main")) > 0, "nothing taken")
    for destination in ("main", "slow", "r500", "r400"):
        for labels, ts in per_series(lab.receiver.taken(destination)).items():
            assert increasing(ts), (destination, labels, ts)


def case_a_batch_answered_500_arrives_later(lab: Lab) -> None:
    lab.wait(lambda: "r500" in lab.receiver.refused, "no batch was answered 500")
    refused = lab.receiver.refused["r500"].samples
    lab.wait(lambda: set(refused) <= set(lab.receiver.taken("r500")), "the batch answered 500 never arrived")
    assert lab.metric("prometheus_remote_storage_samples_retried_total", "r500") >= len(refused)


def case_a_batch_answered_400_never_arrives(lab: Lab) -> None:
    lab.wait(lambda: "r400" in lab.receiver.refused, "no batch was answered 400")
    refused = lab.receiver.refused["r400"].samples
    newest = max(t for _, t, _ in refused)
    lab.wait(
        lambda: any(t > newest for _, t, _ in select(lab.receiver.taken("r400"), "now")),
        "nothing arrived after the batch answered 400",
    )
    assert set(refused).isdisjoint(lab.receiver.taken("r400"))
    assert lab.metric("prometheus_remote_storage_samples_failed_total", "r400") == len(refused)


CASES = [
    case_counter,
    case_gauge,
    case_histogram,
    case_summary,
    case_up,
    case_invalid_page_is_up_0,
    case_job_label,
    case_instance_label,
    case_sorted_labels,
    case_repeated_labels_fail_the_scrape,
    case_empty_label_is_dropped,
    case_missing_name_fails_the_scrape,
    case_honor_labels_false_exports_the_page_job,
    case_every_label_set_sorted_unique_nonempty_and_named,
    case_staleness_marker_when_a_series_goes,
    case_staleness_markers_when_a_target_goes,
    case_timestamps_within_the_run,
    case_headers,
    case_series_in_time_order_under_a_slow_receiver,
    case_every_series_in_time_order,
    case_a_batch_answered_500_arrives_later,
    case_a_batch_answered_400_never_arrives,
]


def test_the_sender_passes_the_compliance_cases(tmp_path: Path) -> None:
    """Every case on one gpuwatch and one receiver. One test, not one per case: xdist would spread
    the cases over its workers, each starting a gpuwatch of its own. Every case runs; each failure is
    reported under its case's name."""
    failures = []
    with run_lab(tmp_path) as lab:
        for case in CASES:
            try:
                case(lab)
            except AssertionError as exc:
                failures.append(f"{case.__name__.removeprefix('case_')}: {exc}")
    assert not failures, f"{len(failures)} of {len(CASES)} cases failed:\n\n" + "\n\n".join(failures)
