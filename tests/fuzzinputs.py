"""Cheap, seeded, hostile HTTP requests over every endpoint family a client can write to or query.

`requests_for(seed, n)` yields `n` requests `(method, path, kwargs for requests)`: PromQL instant and
range queries, Pushgateway pushes (`/metrics/job/...`), JSON pushes and runs, imports, the label and
series APIs, federation, silences and posted alerts. Each is built from the grammar of what it attacks
(valid pieces most of the time, so that the parsers let it through to the code behind them), then
mutated now and then (characters deleted, repeated, replaced by odd ones, cut short). One
`random.Random(seed)` draws everything, so a failure names the seed and the input's number.
"""

from __future__ import annotations

import base64
import gzip
import json
import random
from collections.abc import Iterator
from typing import Any

Request = tuple[str, str, dict[str, Any]]

# fmt: off
METRICS = [
    'DCGM_FI_DEV_GPU_UTIL', 'DCGM_FI_DEV_FB_USED', 'up', 'gpuwatch_store_series', 'gpuwatch_job_runs_total',
    'vllm:num_requests_running', 'fuzz_pushed', 'fuzz_hist_bucket', 'x', 'a_b:c',
]
LABELS = [
    'gpu', 'job', 'instance', 'le', 'quantile', 'Hostname', 'UUID', '__name__', 'a', 'run', 'bé',
]
ODD = [
    '', ' ', '\\', '"', "'", '`', '\n', '\t', '\x00', '\x7f', 'é', '\u2028', '\ud800', '😀', '{', '}', '[', ']',
    '(', ')', ',', '=', '=~', '!~', '%', '%00', '%2F', '/', '..', '$1', '{{', '}}', 'NaN', 'Inf', '-Inf',
    '1e308', '1e-320', '-0', '0x1F', '1_000', '9999999999999999999999999999999999999999', '#', '@', ':', ';',
]
NUMBERS = [
    '0', '1', '-1', '0.5', '1e3', '1e308', '1e309', '-1e309', 'NaN', 'nan', '+Inf', '-Inf', 'inf', '0x10',
    '1_0', '999999999999999999999999999999', '-9223372036854775809', '4.9e-324', '.5', '5.', '1e', '', 'abc',
]
DURATIONS = [
    '1s', '5m', '1h', '0s', '1ms', '2d', '1w', '1y', '1h30m', '100000000y', '-5m', '1.5m', '1e3s', '5', '0',
    'ms',
]
TIMES = [
    '', '0', '-1', '1700000000', '1700000000.123', '1e20', '-1e20', '9223372036854775807', 'NaN', 'Inf',
    '-Inf', '2023-11-14T22:13:20Z', '2023-11-14T22:13:20.5+02:00', '2023-13-45T99:99:99Z', 'now', 'yesterday',
    '1e-9', '0x10', '1_700_000_000',
]
FUNCTIONS = {
    'rate': 1, 'irate': 1, 'increase': 1, 'delta': 1, 'deriv': 1, 'abs': 1, 'ceil': 1, 'sort': 1,
    'sort_desc': 1, 'avg_over_time': 1, 'max_over_time': 1, 'quantile_over_time': 2, 'count_over_time': 1,
    'last_over_time': 1, 'present_over_time': 1, 'absent': 1, 'absent_over_time': 1, 'histogram_quantile': 2,
    'histogram_fraction': 3, 'label_replace': 5, 'label_join': 4, 'clamp': 3, 'clamp_min': 2, 'round': 2,
    'predict_linear': 2, 'holt_winters': 3, 'time': 0, 'vector': 1, 'scalar': 1, 'timestamp': 1, 'changes': 1,
    'resets': 1, 'day_of_week': 1, 'exp': 1, 'ln': 1, 'sqrt': 1, 'sgn': 1, 'nosuchfunc': 1,
}
AGGREGATIONS = [
    'sum', 'avg', 'min', 'max', 'count', 'stddev', 'topk', 'bottomk', 'quantile', 'count_values', 'group',
]
# fmt: on
RANGE_FUNCTIONS = ("rate", "irate", "increase", "delta", "deriv", "changes", "resets")
BINOPS = ["+", "-", "*", "/", "%", "^", "==", "!=", ">", "<", ">=", "<=", "and", "or", "unless", "atan2"]


class Inputs:
    """One seeded stream of inputs (see the module docstring)."""

    def __init__(self, seed: int, now_s: int) -> None:
        self.r = random.Random(seed)
        self.now_s = now_s

    # -- pieces -------------------------------------------------------------------------------------
    def pick(self, xs: list[str]) -> str:
        return xs[self.r.randrange(len(xs))]

    def word(self) -> str:
        r = self.r
        k = r.random()
        if k < 0.75:
            return "".join(r.choice("abcxyz_019") for _ in range(r.randint(1, 8)))
        if k < 0.93:
            return "".join(self.pick(ODD) for _ in range(r.randint(1, 4)))
        return "".join(chr(r.randrange(0x20, 0x3000)) for _ in range(r.randint(1, 6)))

    def mutate(self, s: str) -> str:
        """`s` with a few random edits, now and then."""
        r = self.r
        if not s or r.random() < 0.8:
            return s
        for _ in range(r.randint(1, 3)):
            i = r.randrange(len(s) + 1)
            op = r.random()
            if op < 0.3:
                s = s[:i] + s[i + 1 :]
            elif op < 0.6:
                s = s[:i] + self.pick(ODD) + s[i:]
            elif op < 0.8:
                s = s[:i] + s[i : i + r.randint(1, 10)] * r.randint(2, 5) + s[i:]
            else:
                s = s[:i]
            if not s:
                return s
        return s

    def label_value(self) -> str:
        return self.word() if self.r.random() < 0.7 else self.pick(["0", "1", "+Inf", "0.5", "GPU-1", ""])

    # -- PromQL -------------------------------------------------------------------------------------
    def selector(self) -> str:
        r = self.r
        name = self.pick(METRICS) if r.random() < 0.85 else ""
        matchers = []
        for _ in range(r.randint(0, 3) if name else r.randint(1, 3)):
            value = self.label_value()
            op = self.pick(["=", "!=", "=~", "!~"])
            if op in ("=~", "!~") and r.random() < 0.5:
                value = self.pick([".*", ".+", "a|b", "(a+)+$", "[", "(?i)gpu.*", "\\d+", "(?=x)", "x{1000}"])
            matchers.append(f"{self.pick(LABELS)}{op}{json.dumps(value)}")
        s = name + ("{" + ",".join(matchers) + "}" if matchers or not name else "")
        return s

    def duration(self) -> str:
        return self.pick(DURATIONS)

    def expr(self, depth: int = 0) -> str:
        r = self.r
        k = r.random() if depth < 4 else r.random() * 0.45
        if k < 0.25:
            return self.selector()
        if k < 0.35:
            return self.pick(NUMBERS) or "1"
        if k < 0.4:
            return json.dumps(self.word())
        if k < 0.5:
            s = f"{self.selector()}[{self.duration()}]"
            return f"{self.pick(['rate', 'max_over_time', 'count_over_time', 'increase'])}({s})"
        if k < 0.6:
            return self.call(depth)
        if k < 0.72:
            return self.aggregation(depth)
        if k < 0.86:
            return self.binary(depth)
        if k < 0.92:
            return f"({self.expr(depth + 1)})[{self.duration()}:{self.pick([*DURATIONS, ''])}]"
        if k < 0.96:
            return f"{self.selector()} offset {self.duration()}"
        return f"{self.selector()} @ {self.pick([*TIMES, 'start()', 'end()']) or '0'}"

    def call(self, depth: int) -> str:
        r = self.r
        name = self.pick(list(FUNCTIONS))
        args = [self.expr(depth + 1) for _ in range(FUNCTIONS[name] + (r.random() < 0.1))]
        if args and (name.endswith("_over_time") or name in RANGE_FUNCTIONS) and r.random() < 0.8:
            args[0] = f"{self.selector()}[{self.duration()}]"
        if name in ("label_replace", "label_join"):
            args[1:] = [json.dumps(self.word()) for _ in args[1:]]
        return f"{name}({', '.join(args)})"

    def aggregation(self, depth: int) -> str:
        r = self.r
        agg = self.pick(AGGREGATIONS)
        grouping = ""
        if r.random() < 0.5:
            names = ", ".join(self.pick(LABELS) for _ in range(r.randint(0, 3)))
            grouping = f" {self.pick(['by', 'without'])} ({names})"
        param = f"{self.pick(NUMBERS) or '1'}, " if agg in ("topk", "bottomk", "quantile") else ""
        if agg == "count_values":
            param = json.dumps(self.word()) + ", "
        return f"{agg}{grouping}({param}{self.expr(depth + 1)})"

    def binary(self, depth: int) -> str:
        r = self.r
        op = self.pick(BINOPS)
        mod = ""
        if r.random() < 0.3:
            mod = f" {self.pick(['on', 'ignoring'])}({self.pick(LABELS)})"
            if r.random() < 0.5:
                mod += f" {self.pick(['group_left', 'group_right'])}({self.pick(LABELS)})"
        if r.random() < 0.1:
            mod = " bool" + mod
        return f"{self.expr(depth + 1)} {op}{mod} {self.expr(depth + 1)}"

    def promql(self) -> str:
        return self.mutate(self.expr())

    # -- exposition text ----------------------------------------------------------------------------
    def sample_line(self, with_time: bool) -> str:
        r = self.r
        name = self.pick(METRICS) if r.random() < 0.7 else self.word()
        labels = ",".join(
            f"{self.pick(LABELS) if r.random() < 0.7 else self.word()}={json.dumps(self.label_value())}"
            for _ in range(r.randint(0, 4))
        )
        line = name + ("{" + labels + "}" if labels or r.random() < 0.1 else "") + " " + self.pick(NUMBERS)
        if with_time or r.random() < 0.2:
            line += " " + self.pick(
                [
                    "1700000000000",
                    "0",
                    "-1",
                    "1e20",
                    "9999999999999999",
                    "x",
                    str(1_700_000_000_000 + r.randrange(10**9)),
                ]
            )
        return line

    def exposition(self, with_time: bool = False) -> str:
        r = self.r
        lines = []
        for _ in range(r.randint(0, 12)):
            k = r.random()
            if k < 0.15:
                lines.append(
                    f"# TYPE {self.pick(METRICS)} {self.pick(['counter', 'gauge', 'histogram', 'summary', 'untyped', 'info', 'stateset', 'bogus'])}"
                )
            elif k < 0.25:
                lines.append(f"# HELP {self.pick(METRICS)} {self.word()}")
            elif k < 0.3:
                lines.append(self.pick(["# EOF", "#", "", "# UNIT x seconds"]))
            else:
                lines.append(self.sample_line(with_time))
        return self.mutate("\n".join(lines) + ("\n" if r.random() < 0.9 else ""))

    def grouping(self) -> str:
        r = self.r
        parts = ["job", self.label_value() or "j"]
        if r.random() < 0.1:
            parts = [self.word(), self.word()]
        for _ in range(r.randint(0, 3)):
            name = self.pick(LABELS) if r.random() < 0.8 else self.word()
            value = self.label_value()
            if r.random() < 0.2:
                name += "@base64"
                value = self.pick(
                    [base64.urlsafe_b64encode(value.encode("utf-8", "surrogatepass")).decode(), "!!", "=", ""]
                )
            parts += [name, value]
        if r.random() < 0.1:
            parts.append(self.word())  # an odd number of parts
        return self.mutate("/".join(parts))

    # -- JSON ---------------------------------------------------------------------------------------
    def json_value(self, depth: int = 0) -> Any:
        r = self.r
        k = r.random() if depth < 3 else r.random() * 0.6
        if k < 0.15:
            return r.choice([None, True, False])
        if k < 0.3:
            return r.choice([0, 1, -1, 2**63, -(2**64), 1.5, 1e308, 10**40])
        if k < 0.6:
            return self.word()
        if k < 0.8:
            return [self.json_value(depth + 1) for _ in range(r.randint(0, 3))]
        return {self.word(): self.json_value(depth + 1) for _ in range(r.randint(0, 3))}

    def maybe(self, good: Any) -> Any:
        return good if self.r.random() < 0.88 else self.json_value(1)

    def json_push(self) -> Any:
        r = self.r
        one = {
            "run": self.maybe(self.label_value() or "run"),
            "step": self.maybe(r.randrange(10**6)),
            "metrics": self.maybe(
                {
                    self.pick(["loss", "lr", "acc"]) if r.random() < 0.6 else self.word(): self.maybe(
                        r.random()
                    )
                    for _ in range(r.randint(0, 4))
                }
            ),
        }
        if r.random() < 0.3:
            one["time"] = self.maybe(r.choice([1_700_000_000, 1.7e9, -1, 1e20]))
        if r.random() < 0.3:
            one["labels"] = self.maybe({self.word(): self.label_value() for _ in range(r.randint(0, 3))})
        for key in list(one):
            if r.random() < 0.05:
                del one[key]
        return [one, self.maybe(one)] if r.random() < 0.2 else one

    def run_update(self) -> Any:
        r = self.r
        return {
            "run": self.maybe(self.label_value() or "run"),
            "action": self.maybe(self.pick(["init", "init", "finish", "bogus"])),
            "config": self.maybe({self.word(): self.json_value(1) for _ in range(r.randint(0, 3))}),
            "total_steps": self.maybe(r.randrange(-5, 10**6)),
            "host": self.maybe(self.word()),
            "gpus": self.maybe([r.randrange(8) for _ in range(r.randint(0, 3))]),
            "step": self.maybe(r.randrange(10**6)),
        }

    def time_text(self) -> str:
        if self.r.random() < 0.6:
            return self.pick(["1700000000", "1800000000", "2024-01-01T00:00:00Z", "2099-01-01T00:00:00Z"])
        return self.pick([*TIMES, "1970-01-01T00:00:00Z"])

    def silence(self) -> Any:
        r = self.r
        matchers = [
            {
                "name": self.maybe(self.pick([*LABELS, "alertname", "severity"])),
                "value": self.maybe(
                    self.label_value() if r.random() < 0.8 else self.pick(["(a+)+$", ".*", "[", "(?=a)"])
                ),
                "isRegex": self.maybe(r.random() < 0.4),
                "isEqual": self.maybe(r.random() < 0.8),
            }
            for _ in range(r.randint(0, 3))
        ]
        body: dict[str, Any] = {
            "matchers": self.maybe(matchers),
            "startsAt": self.maybe(self.time_text()),
            "endsAt": self.maybe(self.time_text()),
            "createdBy": self.maybe(self.word()),
            "comment": self.maybe(self.word()),
        }
        if r.random() < 0.2:
            body["id"] = self.maybe(self.word())
        return body

    def alerts(self) -> Any:
        r = self.r
        out = []
        for _ in range(r.randint(0, 3)):
            a: dict[str, Any] = {
                "labels": self.maybe(
                    {
                        "alertname": self.label_value() or "A",
                        **{
                            (self.pick(LABELS) if r.random() < 0.5 else self.word()): self.label_value()
                            for _ in range(r.randint(0, 3))
                        },
                    }
                ),
            }
            if r.random() < 0.5:
                a["annotations"] = self.maybe({self.word(): self.word()})
            if r.random() < 0.5:
                a["startsAt"] = self.maybe(self.time_text())
            if r.random() < 0.5:
                a["endsAt"] = self.maybe(self.time_text())
            if r.random() < 0.2:
                a["generatorURL"] = self.maybe(self.word())
            out.append(a)
        return self.maybe(out)

    def json_body(self, value: Any) -> dict[str, Any]:
        """A JSON body, or now and then a broken one."""
        r = self.r
        text = json.dumps(value, ensure_ascii=r.random() < 0.5)
        if r.random() < 0.1:
            text = self.mutate(text) if r.random() < 0.8 else text[: r.randrange(len(text) + 1)]
        return {
            "data": text.encode("utf-8", "surrogatepass"),
            "headers": {"Content-Type": "application/json"},
        }

    # -- requests -----------------------------------------------------------------------------------
    def request(self) -> Request:
        """One request of a family drawn by weight."""
        k = self.r.randrange(100)
        for upto, make in (
            (30, self.query),
            (45, self.query_range),
            (55, self.pushgateway),
            (63, lambda: ("POST", "/api/v1/push", self.json_body(self.json_push()))),
            (65, lambda: ("POST", "/api/v1/runs", self.json_body(self.run_update()))),
            (71, self.import_text),
            (81, self.metadata_read),
            (90, self.silence_request),
        ):
            if k < upto:
                return make()
        return self.alert_request()

    def query(self) -> Request:
        r = self.r
        params = {"query": self.promql()}
        if r.random() < 0.4:
            params["time"] = self.time_text()
        if r.random() < 0.1:
            params["timeout"] = self.pick(DURATIONS)
        if r.random() < 0.6:
            return ("GET", "/api/v1/query", {"params": params})
        return ("POST", "/api/v1/query", {"data": params})

    def query_range(self) -> Request:
        r = self.r
        params = {
            "query": self.promql(),
            "start": self.pick(TIMES) if r.random() < 0.15 else str(self.now_s - r.randrange(7200)),
            "end": self.pick(TIMES) if r.random() < 0.15 else str(self.now_s + r.randrange(600)),
            "step": self.pick([*DURATIONS, *NUMBERS]) if r.random() < 0.15 else self.pick(["15", "60", "5s"]),
        }
        return ("GET", "/api/v1/query_range", {"params": params})

    def pushgateway(self) -> Request:
        r = self.r
        body = self.exposition().encode("utf-8", "surrogatepass")
        headers = {}
        if r.random() < 0.15:
            headers["Content-Type"] = "application/openmetrics-text; version=1.0.0"
        if r.random() < 0.08:
            headers["Content-Encoding"] = "gzip"
            body = gzip.compress(body) if r.random() < 0.7 else body
        method = self.pick(["PUT", "POST", "POST", "DELETE"])
        return (method, "/metrics/" + self.grouping(), {"data": body, "headers": headers})

    def import_text(self) -> Request:
        body = self.exposition(with_time=True).encode("utf-8", "surrogatepass")
        return ("POST", "/api/v1/import/prometheus", {"data": body})

    def metadata_read(self) -> Request:
        r = self.r
        params: dict[str, Any] = {}
        if r.random() < 0.5:
            params["start"] = self.time_text()
        if r.random() < 0.5:
            params["end"] = self.time_text()
        if r.random() < 0.2:
            params["limit"] = self.pick(NUMBERS)
        kk = r.randrange(5)
        if kk == 0:
            params["match[]"] = [self.mutate(self.selector()) for _ in range(r.randint(1, 2))]
            return ("GET", "/api/v1/series", {"params": params})
        if kk < 3 and r.random() < 0.5:
            params["match[]"] = self.mutate(self.selector())
        if kk == 1:
            return ("GET", "/api/v1/labels", {"params": params})
        if kk == 2:
            name = self.pick(LABELS) if r.random() < 0.7 else self.word()
            return ("GET", f"/api/v1/label/{name}/values", {"params": params})
        if kk == 3:
            return ("GET", "/federate", {"params": {"match[]": self.mutate(self.selector())}})
        params = {"metric": self.pick(METRICS), "limit": self.pick(NUMBERS)}
        return ("GET", "/api/v1/metadata", {"params": params})

    def silence_request(self) -> Request:
        kk = self.r.randrange(4)
        if kk < 2:
            return ("POST", "/api/v2/silences", self.json_body(self.silence()))
        if kk == 2:
            op = self.pick(["=", "!=", "=~", "!~"])
            matcher = f"{self.pick(LABELS)}{op}{json.dumps(self.label_value())}"
            return ("GET", "/api/v2/silences", {"params": {"filter": self.mutate(matcher)}})
        return ("DELETE", f"/api/v2/silence/{self.word()}", {})

    def alert_request(self) -> Request:
        if self.r.random() < 0.8:
            return ("POST", "/api/v2/alerts", self.json_body(self.alerts()))
        matcher = self.mutate('alertname="' + self.word() + '"')
        return ("GET", "/api/v2/alerts", {"params": {"filter": matcher}})


def requests_for(seed: int, n: int, now_s: int) -> Iterator[Request]:
    """Yield `n` requests drawn from `seed`; range queries end near `now_s` (Unix seconds)."""
    inputs = Inputs(seed, now_s)
    for _ in range(n):
        yield inputs.request()
