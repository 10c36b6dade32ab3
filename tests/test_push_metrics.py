"""Pushed groups on gpuwatch's own /metrics, as a Pushgateway shows them."""

from __future__ import annotations

from flask.testing import FlaskClient
from prometheus_client.parser import text_string_to_metric_families

from gpuwatch.app.runtime import Runtime
from gpuwatch.core.clock import FakeClock


def scraped(client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:  # type: ignore[no-untyped-def]
    text = client.get("/metrics").get_data(as_text=True)
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def test_pushed_groups_and_push_time_on_own_metrics(
    runtime: Runtime, client: FlaskClient, clock: FakeClock
) -> None:
    runtime.jobs.run("sample")
    body = b'# TYPE batch_rows gauge\nbatch_rows{table="t"} 42\n'
    assert client.put("/metrics/job/nightly/instance/node-1", data=body).status_code == 200
    key = (("instance", "node-1"), ("job", "nightly"))
    got = scraped(client)
    assert got[("batch_rows", (("instance", "node-1"), ("job", "nightly"), ("table", "t")))] == 42
    assert got[("push_time_seconds", key)] == clock.now()
    assert any(name == "DCGM_FI_DEV_GPU_UTIL" for name, _ in got), "the GPU figures are still there"
    clock.advance(30)
    assert client.post("/metrics/job/nightly/instance/node-1", data=b"other 1\n").status_code == 200
    got = scraped(client)
    assert got[("push_time_seconds", key)] == clock.now() and ("other", key) in got
    assert client.delete("/metrics/job/nightly/instance/node-1").status_code == 200
    got = scraped(client)
    assert not [n for n, labels in got if dict(labels).get("job") == "nightly"]
