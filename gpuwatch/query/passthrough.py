"""What a remote store's query answer must show, read as bytes, for a face to pass it on unread.

A face (`storage.remote`) answering `/api/v1/query_range` by reading the store's JSON into arrays and
writing it back spends about 1 us a point and holds every point as Python objects meanwhile (96 MiB at
a 512-GPU cluster page). The answer the browser gets is the same JSON, so where the bytes show a plain
success answer within gpuwatch's limits they are sent as they came.

The checks rely on one property of JSON: a `"` byte inside a string is always escaped (`\\"`), so a
pattern holding unescaped quotes around a key can only be that key, never a label's value. What the
checks cannot judge (another layout, a native histogram, an answer near `query_max_samples`) goes
the old way, parsed, which raises gpuwatch's errors: a miss costs time, never a wrong answer.
"""

from __future__ import annotations

SUCCESS = b'{"status":"success",'  # as Prometheus and VictoriaMetrics write it, the status first
# `data` holds the result type, then the result: compact, as both write it
_DATA = {kind: b'"data":{"resultType":"%s","result":[' % kind.encode() for kind in ("matrix", "vector")}
_RESULT = b'"result":['
# Prometheus's native histograms (`"histogram":[t,{...}]` in a vector, `"histograms":[[t,{...}]]` in a
# matrix): gpuwatch's reading leaves them out, so an answer that has them is read. One scan for what
# both begin with (a label value may too), the exact keys only where it is found.
_HISTOGRAM = b'"histogram'
_HISTOGRAMS = (b'"histogram":[', b'"histograms":[')
# Every point and sample ends `,"<value>"]` (`[1790000000,"1.5"]`), and a value is always a string:
# the count of `"]` is at least the number of points (a label value or a warning may hold it too).
POINT_END = b'"]'


def result_type(body: bytes) -> str | None:
    """`matrix` or `vector` where `body` is a success answer of that type, laid out as Prometheus and
    VictoriaMetrics write it, with no native histograms; None for anything else."""
    if not body.startswith(SUCCESS) or not body.rstrip().endswith(b"}"):
        return None
    at = body.find(_RESULT)  # the first key `result` with a list: the data's (labels come after it)
    if at < 0:
        return None
    head = body[: at + len(_RESULT)]
    kind = next((k for k, pattern in _DATA.items() if head.endswith(pattern)), None)
    if kind is None or (_HISTOGRAM in body and any(pattern in body for pattern in _HISTOGRAMS)):
        return None
    return kind


def points_at_most(body: bytes) -> int:
    """An upper bound of the points (a matrix) or samples (a vector) in a success answer's `body`,
    counted at C speed: equal to them where no label value or warning holds `"]`."""
    return body.count(POINT_END)
