"""Scrape logic over a fake fetch and a fake clock: labels, relabelling, limits, staleness, file_sd."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from flask.testing import FlaskClient

from gpuwatch.app.build import build_runtime
from gpuwatch.app.config import load
from gpuwatch.app.runtime import Runtime
from gpuwatch.collect.fetch import FetchResult
from gpuwatch.collect.scrapeconfig import parse_scrape_configs
from gpuwatch.collect.scrapepool import ScrapePool
from gpuwatch.collect.targetspec import TargetSpec
from gpuwatch.core.clock import FakeClock
from gpuwatch.core.errors import ScrapeError
from gpuwatch.core.model import Batch, LabelLimits, Labels, SeriesLimits, is_stale
from gpuwatch.demo.nvml import FakeNvml


class FakeFetch:
    """Answers each address with the bytes (or the ScrapeError) set for it."""

    def __init__(self) -> None:
        self.bodies: dict[str, bytes | ScrapeError] = {}
        self.calls: list[str] = []

    def __call__(self, spec: TargetSpec, timeout_s: float) -> FetchResult:
        self.calls.append(spec.url)
        body = self.bodies[spec.address]
        if isinstance(body, ScrapeError):
            raise body
        return FetchResult(body, "text/plain; version=0.0.4")


def pool_for(
    jobs: list[dict[str, object]],
    fetch: Callable[[TargetSpec, float], FetchResult],
    clock: FakeClock,
    **kw: object,
):  # type: ignore[no-untyped-def]
    batches: list[Batch] = []
    pool = ScrapePool(
        parse_scrape_configs(jobs),
        default_interval_s=15.0,
        sink=batches.append,
        clock=clock,
        fetch=fetch,
        **kw,
    )
    return pool, batches


def by_key(batches: list[Batch]) -> dict[tuple[str, Labels], float]:
    return {(s.name, s.labels): s.value for b in batches for s in b.samples}


def L(**kw: str) -> Labels:
    return tuple(sorted(kw.items()))


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_790_000_000)


def test_labels_names_and_values_arrive_exactly(clock: FakeClock) -> None:
    fetch = FakeFetch()
    fetch.bodies["h:1"] = (
        b"# TYPE tgi_request_count counter\ntgi_request_count 2396\n"
        b'vllm:num_requests_running{engine="0",model_name="m"} 3\n'
        b'other{job="scraped",instance="x"} 1.5e+06\n'
    )
    pool, batches = pool_for(
        [{"job_name": "inf", "static_configs": [{"targets": ["h:1"], "labels": {"rack": "r1"}}]}],
        fetch,
        clock,
    )
    pool.scrape_all()
    got = by_key(batches)
    t = {"job": "inf", "instance": "h:1", "rack": "r1"}
    assert got[("tgi_request_count", L(**t))] == 2396
    assert got[("vllm:num_requests_running", L(engine="0", model_name="m", **t))] == 3
    assert got[("other", L(exported_job="scraped", exported_instance="x", **t))] == 1.5e6
    assert got[("up", L(**t))] == 1
    assert got[("scrape_samples_scraped", L(**t))] == 3
    assert got[("scrape_samples_post_metric_relabeling", L(**t))] == 3
    assert got[("scrape_series_added", L(**t))] == 3
    assert batches[0].timestamp_ms == clock.now_ms()
    assert fetch.calls == ["http://h:1/metrics"]


def test_honor_labels_keeps_the_scraped_ones(clock: FakeClock) -> None:
    fetch = FakeFetch()
    fetch.bodies["h:1"] = b'm{job="pushed",instance="node-7"} 1\nn 2\n'
    pool, batches = pool_for(
        [{"job_name": "fed", "honor_labels": True, "static_configs": [{"targets": ["h:1"]}]}], fetch, clock
    )
    pool.scrape_all()
    got = by_key(batches)
    assert got[("m", L(job="pushed", instance="node-7"))] == 1
    assert got[("n", L(job="fed", instance="h:1"))] == 2


def test_metric_relabel_keep_drop_replace_labeldrop(clock: FakeClock) -> None:
    fetch = FakeFetch()
    fetch.bodies["h:1"] = (
        b'vllm:a{pod="p1",hash="x"} 1\nvllm:b{pod="p2",hash="y"} 2\npython_gc 3\nvllm:drop_me 4\n'
    )
    relabel = [
        {"source_labels": ["__name__"], "regex": "vllm:.*", "action": "keep"},
        {"source_labels": ["__name__"], "regex": "vllm:drop_.*", "action": "drop"},
        {
            "source_labels": ["pod", "__name__"],
            "separator": "@",
            "regex": "p(\\d)@vllm:(.*)",
            "target_label": "slot",
            "replacement": "${2}-$1",
        },
        {
            "source_labels": ["__name__"],
            "regex": "vllm:(.*)",
            "target_label": "__name__",
            "replacement": "inf_$1",
        },
        {"regex": "hash|pod", "action": "labeldrop"},
    ]
    pool, batches = pool_for(
        [{"job_name": "j", "metric_relabel_configs": relabel, "static_configs": [{"targets": ["h:1"]}]}],
        fetch,
        clock,
    )
    pool.scrape_all()
    got = by_key(batches)
    t = {"job": "j", "instance": "h:1"}
    assert got[("inf_a", L(slot="a-1", **t))] == 1
    assert got[("inf_b", L(slot="b-2", **t))] == 2
    assert {k[0] for k in got} == {
        "inf_a",
        "inf_b",
        *[
            n
            for n in (
                "up",
                "scrape_duration_seconds",
                "scrape_samples_scraped",
                "scrape_samples_post_metric_relabeling",
                "scrape_series_added",
                "gpuwatch_scrape_invalid_lines",
            )
        ],
    }
    assert got[("scrape_samples_scraped", L(**t))] == 4
    assert got[("scrape_samples_post_metric_relabeling", L(**t))] == 2


def test_sample_limit_fails_the_scrape(clock: FakeClock) -> None:
    fetch = FakeFetch()
    fetch.bodies["h:1"] = b"a 1\n"
    pool, batches = pool_for(
        [{"job_name": "j", "sample_limit": 2, "static_configs": [{"targets": ["h:1"]}]}], fetch, clock
    )
    pool.scrape_all()
    fetch.bodies["h:1"] = b"a 1\nb 2\nc 3\n"
    clock.advance(15)
    del batches[:]
    pool.scrape_all()
    got = by_key(batches)
    t = L(job="j", instance="h:1")
    assert got[("up", t)] == 0
    assert is_stale(got[("a", t)]), "a failed scrape ends the target's series"
    assert ("b", t) not in got
    (state,) = pool.states()
    assert state["health"] == "down"
    assert state["lastError"] == "sample_limit exceeded: 3 samples after relabelling, limit 2"


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (
            b'big{v="' + b"x" * 5000 + b'"} 1\n',
            "label limits exceeded: big: value of label 'v' is longer than 100",
        ),
        (b"wide{" + b",".join(b'l%d="v"' % i for i in range(9)) + b"} 1\n", "wide: more than 8 labels"),
    ],
)
def test_label_limits_fail_the_scrape(clock: FakeClock, body: bytes, error: str) -> None:
    fetch = FakeFetch()
    fetch.bodies["h:1"] = b"a 1\n"
    jobs = [{"job_name": "j", "static_configs": [{"targets": ["h:1"]}]}]
    pool, batches = pool_for(jobs, fetch, clock, label_limits=LabelLimits(8, 100, 100))
    pool.scrape_all()
    fetch.bodies["h:1"] = b"a 2\n" + body
    clock.advance(15)
    del batches[:]
    pool.scrape_all()
    got = by_key(batches)
    t = L(job="j", instance="h:1")
    assert got[("up", t)] == 0 and is_stale(got[("a", t)])
    (state,) = pool.states()
    assert state["health"] == "down" and error in state["lastError"]
    fetch.bodies["h:1"] = b"a 3\n"
    clock.advance(15)
    del batches[:]
    pool.scrape_all()
    assert by_key(batches)[("up", t)] == 1, "the next clean page is taken again"


def _pods(*pods: int) -> bytes:
    return "".join(f'pod_up{{pod="p{i}"}} 1\n' for i in pods).encode()


def test_a_scrape_bringing_more_new_series_than_allowed_fails_and_counts_them_again(clock: FakeClock) -> None:
    fetch = FakeFetch()
    fetch.bodies["h:1"] = _pods(0, 1)
    jobs = [{"job_name": "j", "static_configs": [{"targets": ["h:1"]}]}]
    pool, batches = pool_for(jobs, fetch, clock, series_limits=SeriesLimits(per_request=3, per_minute=0))
    pool.scrape_all()
    t = L(job="j", instance="h:1")
    assert by_key(batches)[("up", t)] == 1
    fetch.bodies["h:1"] = _pods(0, 1, 2, 3, 4, 5)  # 4 new
    for attempt in range(2):  # refused twice: the refused series are not remembered as known
        clock.advance(15)
        del batches[:]
        pool.scrape_all()
        got = by_key(batches)
        assert got[("up", t)] == 0 and ("pod_up", (*t, ("pod", "p5"))) not in got
        if attempt == 0:
            assert is_stale(got[("pod_up", (*t, ("pod", "p0")))]), "a failed scrape ends the target's series"
        (state,) = pool.states()
        assert state["health"] == "down"
        assert state["lastError"] == (
            "new series limit exceeded: 4 new series at once, more than max_new_series_per_request (3)"
        )
    fetch.bodies["h:1"] = _pods(0, 1, 2, 3, 4)  # 3 new
    clock.advance(15)
    del batches[:]
    pool.scrape_all()
    assert by_key(batches)[("up", t)] == 1


def test_a_target_bringing_more_new_series_a_minute_than_allowed_fails_until_the_minute_passed(
    clock: FakeClock,
) -> None:
    fetch = FakeFetch()
    jobs = [{"job_name": "j", "static_configs": [{"targets": ["h:1"]}]}]
    pool, batches = pool_for(jobs, fetch, clock, series_limits=SeriesLimits(per_request=0, per_minute=5))
    t = L(job="j", instance="h:1")
    ups = []
    for page in (_pods(0, 1, 2), _pods(3, 4), _pods(5, 6), _pods(5, 6)):  # churning pod labels
        fetch.bodies["h:1"] = page
        del batches[:]
        pool.scrape_all()
        ups.append(by_key(batches)[("up", t)])
        clock.advance(20)
    assert ups == [1, 1, 0, 1], "the third page's 2 would make 7 in a minute; a minute after the first, 4"
    (state,) = pool.states()
    assert state["health"] == "up"


def test_staleness_for_a_vanished_series_and_a_target_going_down(clock: FakeClock) -> None:
    fetch = FakeFetch()
    fetch.bodies["h:1"] = b'a 1\nb{x="1"} 2\nts_given 5 1789999999000\n'
    pool, batches = pool_for([{"job_name": "j", "static_configs": [{"targets": ["h:1"]}]}], fetch, clock)
    pool.scrape_all()
    t = {"job": "j", "instance": "h:1"}
    first = by_key(batches)
    assert first[("a", L(**t))] == 1
    assert batches[1].timestamp_ms == 1789999999000, "exposed timestamps are kept"
    fetch.bodies["h:1"] = b"a 1.5\n"
    clock.advance(15)
    del batches[:]
    pool.scrape_all()
    got = by_key(batches)
    assert got[("a", L(**t))] == 1.5
    assert is_stale(got[("b", L(x="1", **t))])
    assert ("ts_given", L(**t)) not in got, "series with their own timestamps get no markers"
    assert batches[0].timestamp_ms == clock.now_ms()
    fetch.bodies["h:1"] = ScrapeError("connection refused")
    clock.advance(15)
    del batches[:]
    pool.scrape_all()
    got = by_key(batches)
    assert is_stale(got[("a", L(**t))])
    assert got[("up", L(**t))] == 0
    assert pool.states()[0]["lastError"] == "connection refused"
    clock.advance(15)
    del batches[:]
    pool.scrape_all()
    assert {k[0] for k in by_key(batches)} >= {"up"} and ("a", L(**t)) not in by_key(batches)


def test_invalid_lines_are_counted_not_fatal(clock: FakeClock) -> None:
    fetch = FakeFetch()
    fetch.bodies["h:1"] = b"good 1\nthis is { garbage\n\xff\xfe 2\nalso_good 2\n"
    pool, batches = pool_for([{"job_name": "j", "static_configs": [{"targets": ["h:1"]}]}], fetch, clock)
    pool.scrape_all()
    got = by_key(batches)
    t = L(job="j", instance="h:1")
    assert got[("good", t)] == 1 and got[("also_good", t)] == 2 and got[("up", t)] == 1
    assert got[("gpuwatch_scrape_invalid_lines", t)] == 2
    (state,) = pool.states()
    assert state["health"] == "up" and state["invalidLines"] == 2
    assert state["firstInvalidLine"].startswith("line 2:")


def test_a_page_with_no_valid_line_is_a_failed_scrape(clock: FakeClock) -> None:
    """An HTML error page or another protocol on the port: `up` 0 and the target down, as in
    Prometheus; an empty page is still a scrape of nothing."""
    fetch = FakeFetch()
    fetch.bodies["h:1"] = b"<html><body>502 Bad Gateway</body></html>\n"
    fetch.bodies["h:2"] = b""
    pool, batches = pool_for(
        [{"job_name": "j", "static_configs": [{"targets": ["h:1", "h:2"]}]}], fetch, clock
    )
    pool.scrape_all()
    got = by_key(batches)
    assert got[("up", L(job="j", instance="h:1"))] == 0
    assert got[("gpuwatch_scrape_invalid_lines", L(job="j", instance="h:1"))] == 1
    assert got[("up", L(job="j", instance="h:2"))] == 1
    states = {s["labels"]["instance"]: s for s in pool.states()}
    assert states["h:1"]["health"] == "down" and states["h:2"]["health"] == "up"
    assert states["h:1"]["lastError"].startswith("no valid line in the page (1 invalid; line 1:")


def test_file_sd_is_reread_when_it_changes(clock: FakeClock, tmp_path: Path) -> None:
    fetch = FakeFetch()
    fetch.bodies["a:1"] = b"m 1\n"
    fetch.bodies["b:2"] = b"m 2\n"
    (tmp_path / "targets").mkdir()
    f = tmp_path / "targets" / "inference.json"
    f.write_text(json.dumps([{"targets": ["a:1"], "labels": {"team": "x"}}]))
    pool, batches = pool_for(
        [{"job_name": "sd", "file_sd_configs": [{"files": ["targets/*.json", "targets/*.yml"]}]}],
        fetch,
        clock,
        base_dir=tmp_path,
    )
    assert [t.spec.address for t in pool.targets()] == ["a:1"]
    pool.scrape_all()
    assert by_key(batches)[("m", L(job="sd", instance="a:1", team="x"))] == 1
    (tmp_path / "targets" / "more.yml").write_text("- targets: ['b:2']\n")
    f.write_text(json.dumps([{"targets": ["a:9"]}]))
    st = f.stat()
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))
    del batches[:]
    pool.refresh()
    assert sorted(t.spec.address for t in pool.targets()) == ["a:9", "b:2"]
    got = by_key(batches)
    assert is_stale(got[("m", L(job="sd", instance="a:1", team="x"))]), "a removed target's series end"
    assert is_stale(got[("up", L(job="sd", instance="a:1", team="x"))])
    f.write_text("not json [")
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 4_000_000_000))
    pool.refresh()
    assert sorted(t.spec.address for t in pool.targets()) == ["a:9", "b:2"], "a broken file keeps its targets"
    assert "not valid JSON" in next(iter(pool.file_errors.values()))


@pytest.fixture
def runtime(tmp_path: Path, clock: FakeClock) -> Iterator[Runtime]:
    settings = load(
        None,
        {},
        {
            "data_dir": str(tmp_path / "data"),
            "demo": True,
            "scrape_configs": [{"job_name": "vllm", "static_configs": [{"targets": ["h:1"]}]}],
        },
    )
    rt = build_runtime(
        settings, "node-1", clock=clock, nvml=FakeNvml(gpu_count=1, clock=clock, blocking_event_wait=False)
    )
    yield rt
    rt.close()


def test_runtime_targets_api_and_queries(runtime: Runtime, client: FlaskClient, clock: FakeClock) -> None:
    assert runtime.scrapes is not None
    fetch = FakeFetch()
    fetch.bodies["h:1"] = (
        b"# HELP vllm:num_requests_waiting Requests waiting.\n# TYPE vllm:num_requests_waiting gauge\n"
        b'vllm:num_requests_waiting{model_name="m"} 4\ngone 1\n'
    )
    runtime.scrapes = ScrapePool(
        runtime.scrapes.configs, default_interval_s=15.0, sink=runtime.store.append, clock=clock, fetch=fetch
    )
    before = client.get("/api/v1/targets").get_json()
    assert before["data"]["activeTargets"][0]["health"] == "unknown"
    assert before["data"]["activeTargets"][0]["lastScrape"] == "0001-01-01T00:00:00Z"
    runtime.scrapes.scrape_all()
    clock.advance(15)
    fetch.bodies["h:1"] = b'vllm:num_requests_waiting{model_name="m"} 5\n'
    runtime.scrapes.scrape_all()
    runtime.store.flush()
    body = client.get("/api/v1/targets").get_json()
    assert body["status"] == "success" and body["data"]["droppedTargets"] == []
    (t,) = body["data"]["activeTargets"]
    assert t["labels"] == {"instance": "h:1", "job": "vllm"}
    assert t["scrapePool"] == "vllm" and t["scrapeUrl"] == "http://h:1/metrics"
    assert t["health"] == "up" and t["lastError"] == "" and t["lastScrape"].endswith("Z")
    assert t["discoveredLabels"]["__address__"] == "h:1" and t["scrapeInterval"] == "15s"
    assert "activeTargets" not in client.get("/api/v1/targets?state=dropped").get_json()["data"]
    q = client.get("/api/v1/query", query_string={"query": "vllm:num_requests_waiting"}).get_json()
    (r,) = q["data"]["result"]
    assert r["metric"] == {
        "__name__": "vllm:num_requests_waiting",
        "job": "vllm",
        "instance": "h:1",
        "model_name": "m",
    }
    assert r["value"][1] == "5"
    assert client.get("/api/v1/query", query_string={"query": "gone"}).get_json()["data"]["result"] == [], (
        "the staleness marker hides a vanished series at once"
    )
    meta = client.get("/api/v1/metadata").get_json()["data"]
    assert meta["vllm:num_requests_waiting"] == [{"type": "gauge", "help": "Requests waiting.", "unit": ""}]
    assert meta["DCGM_FI_DEV_GPU_UTIL"][0]["type"] == "gauge", "gpuwatch's own metadata stays"
    up = client.get("/api/v1/query", query_string={"query": "up"}).get_json()["data"]["result"]
    assert [u["value"][1] for u in up] == ["1"]


def test_removing_a_target_mid_scrape_does_not_block_and_still_ends_its_series(clock: FakeClock) -> None:
    release, entered = threading.Event(), threading.Event()
    fetches: list[str] = []

    def fetch(spec: TargetSpec, timeout_s: float) -> FetchResult:
        fetches.append(spec.address)
        if len(fetches) > 1:  # the second scrape hangs until released
            entered.set()
            assert release.wait(10)
        return FetchResult(f"m {len(fetches)}\n".encode(), None)

    pool, batches = pool_for([{"job_name": "j", "static_configs": [{"targets": ["h:1"]}]}], fetch, clock)
    pool.scrape_all()
    (target,) = pool.targets()
    worker = threading.Thread(target=pool.scrape, args=(target,))
    worker.start()
    assert entered.wait(10)
    pool.configs = ()
    pool.refresh()  # returns although the scrape is still running
    assert pool.targets() == []
    del batches[:]
    release.set()
    worker.join(10)
    got = by_key(batches)
    t = L(job="j", instance="h:1")
    assert is_stale(got[("m", t)]) and is_stale(got[("up", t)])


def test_relabel_configs_shape_targets(clock: FakeClock) -> None:
    fetch = FakeFetch()
    fetch.bodies["a:1"] = b"m 1\n"
    relabel = [
        {"source_labels": ["__address__"], "regex": "b:.*", "action": "drop"},
        {"source_labels": ["__address__"], "regex": "(.*):\\d+", "target_label": "instance"},
        {"target_label": "__metrics_path__", "replacement": "/prom"},
        {"target_label": "__param_format", "replacement": "text"},
        {"source_labels": ["team"], "target_label": "owner"},
    ]
    pool, batches = pool_for(
        [
            {
                "job_name": "j",
                "params": {"format": ["om"], "x": ["1"]},
                "relabel_configs": relabel,
                "static_configs": [{"targets": ["a:1", "b:2"], "labels": {"team": "t"}}],
            }
        ],
        fetch,
        clock,
    )
    (target,) = pool.targets()
    assert target.spec.url == "http://a:1/prom?format=text&x=1"
    pool.scrape_all()
    assert by_key(batches)[("m", L(job="j", instance="a", team="t", owner="t"))] == 1
    state = target.state()
    assert state["labels"] == {"instance": "a", "job": "j", "owner": "t", "team": "t"}
    assert state["discoveredLabels"]["__address__"] == "a:1" and state["discoveredLabels"]["team"] == "t"
    assert state["discoveredLabels"]["__param_format"] == "om"
    (dropped,) = pool.dropped_states()
    assert dropped["discoveredLabels"]["__address__"] == "b:2"
