"""The writer's lock-free queue of import records: order, bounds and counts as the buffer keeps.

The recorder queues the payloads of simple import records (``TraceWriter._queue``) and they are
framed into the buffer when anything else touches it; whatever the interleaving with ordinary
appends, boundaries, flushes and size or age drains, the file must hold every record once, in
the order it was appended, and ``records_written`` must count each.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from mighty.trace import TraceWriter, read_trace
from mighty.trace._emit import emit
from tests.trace.paths import PATHS, pure_python

ops = st.lists(
    st.one_of(
        st.tuples(st.just("queue"), st.binary(max_size=40)),
        st.tuples(st.just("append"), st.binary(max_size=5000)),  # some go out as blobs
        st.tuples(st.just("boundary"), st.none()),
        st.tuples(st.just("flush"), st.none()),
    ),
    max_size=40,
)


@PATHS
@settings(max_examples=60)
@given(ops, st.sampled_from(["call", "os", "record"]), st.sampled_from([0, 100, 1 << 20]))
def test_queued_and_appended_records_keep_their_order(
    tmp_path_factory: Any, pure: bool, steps: list[tuple[str, Any]], mode: Any, buffer_bytes: int
) -> None:
    """On the compiled queue (host/trace/_speedups.c) and the pure-Python one alike."""
    path = Path(tmp_path_factory.mktemp("q")) / "t.bin"
    with pure_python(pure):
        writer = TraceWriter(path, {}, flush=mode, buffer_bytes=buffer_bytes)
    expected: list[dict[str, Any]] = []
    for n, (op, data) in enumerate(steps):
        record = {"k": "import" if op == "queue" else "note", "n": n, "data": data}
        if op == "queue":
            if mode == "record":
                writer.append(record)  # the recorder never queues with flush="record"
            else:
                writer.import_records().queue(emit(record))
            expected.append(record)
        elif op == "append":
            writer.append(record)
            expected.append(record)
        elif op == "boundary":
            writer.boundary()
        else:
            writer.flush()
        assert writer.records_written == len(expected)
    writer.close()
    assert list(read_trace(path, strict=True).records()) == expected


@PATHS
def test_threads_queueing_into_one_writer_lose_nothing(tmp_path: Path, pure: bool) -> None:
    """Four threads queue and append at once (small buffer: many drains race the queueing);
    every record is in the file once, and each thread's records are in its own order."""
    path = tmp_path / "t.bin"
    with pure_python(pure):
        writer = TraceWriter(path, {}, flush="call", buffer_bytes=256)

    def work(thread: int) -> None:
        for n in range(400):
            record = {"k": "import", "t": thread, "n": n}
            if n % 7 == 0:
                writer.append(record)
            else:
                writer.import_records().queue(emit(record))
            if n % 50 == 0:
                writer.boundary()

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    writer.close()
    records = list(read_trace(path, strict=True).records())
    assert len(records) == 1600
    for thread in range(4):
        assert [r["n"] for r in records if r["t"] == thread] == list(range(400))
