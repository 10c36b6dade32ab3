"""The receiver's fast read (remote/columns.py) gives what the full protobuf reader gives, for random
requests of both shapes, refused series and repeats included, across requests that share series."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwatch.core.model import STALE_NAN, LabelLimits
from gpuwatch.remote.columns import RunMemory, read_columns
from gpuwatch.remote.receive import Received, Receiver
from gpuwatch.remote.wire import encode_request, encode_series

NOW_MS = 1_764_000_000_000
LIMITS = LabelLimits(labels=4, name_length=20, value_length=24)

LABEL_SETS = [
    (("__name__", "DCGM_FI_DEV_GPU_UTIL"), ("gpu", "0"), ("job", "dcgm")),
    (("gpu", "1"), ("__name__", "DCGM_FI_DEV_GPU_UTIL"), ("job", "dcgm")),  # unsorted
    (("__name__", "up"), ("instance", ""), ("job", "node")),  # an empty value: no label
    (("__name__", "m"), ("a", "1"), ("a", "2")),  # a repeated name: refused
    (("job", "x"),),  # no __name__: refused
    (("__name__", "long"), ("v", "x" * 25)),  # over value_length: refused
    (("__name__", "many"), ("a", "1"), ("b", "1"), ("c", "1"), ("d", "1")),  # over the label limit
    (("__name__", "0bad"),),  # not a Prometheus name
    (("__name__", "ünïcode"), ("k", "värde")),
]

VALUES = st.one_of(st.floats(allow_nan=True), st.just(STALE_NAN), st.sampled_from([0.0, 1.0, -1.0]))
COMMON_TIMES = st.one_of(
    st.sampled_from([NOW_MS, NOW_MS + 1000, NOW_MS + 2000]),  # repeated times
    st.integers(NOW_MS - 5_000, NOW_MS + 5_000),
)
# The shape every sender writes (one sample a series, a time of today) and any other.
common = st.tuples(
    st.integers(0, len(LABEL_SETS) - 1), st.lists(st.tuples(COMMON_TIMES, VALUES), min_size=1, max_size=1)
)
series = st.one_of(
    common,
    st.tuples(
        st.integers(0, len(LABEL_SETS) - 1),
        st.lists(
            st.tuples(st.one_of(COMMON_TIMES, st.integers(-(2**40), 2**50)), VALUES), min_size=1, max_size=3
        ),
    ),
)


def _request(items: list[tuple[int, list[tuple[int, float]]]]) -> bytes:
    return encode_request(
        encode_series(LABEL_SETS[k], [t for t, _ in samples], [v for _, v in samples]) for k, samples in items
    )


def _same(fast: Received, slow: Received) -> None:
    a, b = fast.columns, slow.columns
    assert (a.names, a.labels, a.starts.tolist(), a.t_ms.tolist()) == (
        b.names,
        b.labels,
        b.starts.tolist(),
        b.t_ms.tolist(),
    )
    assert a.values.view(np.int64).tolist() == b.values.view(np.int64).tolist()  # bit for bit
    assert set(fast.refused) == set(slow.refused) and len(fast.refused) == len(set(fast.refused))


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.one_of(st.lists(common, max_size=12), st.lists(series, max_size=12)), min_size=1, max_size=4)
)
def test_read_equals_the_full_reader_on_random_requests(requests: list[list[tuple[int, list]]]) -> None:
    fast_receiver = Receiver()  # remembers label runs across the requests, as in the server
    for items in requests:
        body = _request(items)
        _same(
            fast_receiver.read(body, limits=LIMITS),
            Receiver().received(Receiver().decode(body), limits=LIMITS),
        )


def test_the_common_shape_takes_the_fast_path_and_others_do_not() -> None:
    memory = RunMemory(Receiver()._run)
    one_each = _request([(0, [(NOW_MS, 1.0)]), (1, [(NOW_MS, 2.0)]), (0, [(NOW_MS + 1000, 3.0)])])
    read = read_columns(one_each, memory)
    assert read is not None and read.t_ms.tolist() == [NOW_MS, NOW_MS, NOW_MS + 1000]
    assert read.values.tolist() == [1.0, 2.0, 3.0] and read.runs.tolist() == [0, 1, 0]
    assert read_columns(_request([(0, [(NOW_MS, 1.0), (NOW_MS + 1, 2.0)])]), memory) is None  # 2 samples
    assert read_columns(_request([(0, [(5, 1.0)])]), memory) is None  # a 1-byte time
    assert read_columns(b"\x0a\x05", memory) is None  # cut off
