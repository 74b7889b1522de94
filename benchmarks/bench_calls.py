"""Call overhead and list<u8> marshalling, each as a ratio to stock wasmtime-py in the same run.

Run: .venv/bin/python benchmarks/bench_calls.py [--json]

- call overhead: mighty's `Instance.call("add", 1, 2)` (budget armed, fuel and usage measured on
  every call) against wasmtime-py's `Func.__call__` on the same component. Target <= 1.2x.
- list<u8> 64 KiB round trip (echo through real guest memory): stock wasmtime-py over mighty.
  Target >= 30x faster. Also mighty's list<u8> over mighty's 64 KiB string round trip.
"""

from __future__ import annotations

import wasmtime
from _common import assemble, median, report, samples
from wasmtime import component as wc

from mighty import Component, Instance

REPEAT_CALL = 5000
REPEAT_BYTES = 200


def main() -> None:
    echo = assemble("echo")

    raw_engine = wasmtime.Engine()
    raw_store = wasmtime.Store(raw_engine)
    raw_instance = wc.Linker(raw_engine).instantiate(raw_store, wc.Component(raw_engine, echo))
    raw_add = raw_instance.get_func(raw_store, "add")
    raw_echo = raw_instance.get_func(raw_store, "echo-bytes")
    assert raw_add is not None and raw_echo is not None

    ours = Instance(Component.load(echo))
    data = bytes(range(256)) * 256
    text = "x" * len(data)
    assert ours.call("echo-bytes", data) == data
    assert ours.call("echo-string", text) == text

    raw_call = median(samples(lambda: raw_add(raw_store, 1, 2), repeat=REPEAT_CALL))
    our_call = median(samples(lambda: ours.call("add", 1, 2), repeat=REPEAT_CALL))
    raw_bytes = median(samples(lambda: raw_echo(raw_store, data), repeat=20, warmup=2))
    our_bytes = median(samples(lambda: ours.call("echo-bytes", data), repeat=REPEAT_BYTES))
    our_text = median(samples(lambda: ours.call("echo-string", text), repeat=REPEAT_BYTES))

    report(
        [
            {
                "name": "call add(u32,u32): mighty / raw wasmtime-py",
                "ratio": round(our_call / raw_call, 3),
                "mighty_us": round(our_call * 1e6, 2),
                "raw_us": round(raw_call * 1e6, 2),
                "target": "<= 1.2",
            },
            {
                "name": "list<u8> 64 KiB echo: raw / mighty (speed-up)",
                "ratio": round(raw_bytes / our_bytes, 1),
                "mighty_ms": round(our_bytes * 1e3, 3),
                "raw_ms": round(raw_bytes * 1e3, 3),
                "target": ">= 30",
            },
            {
                "name": "64 KiB echo: list<u8> / string (mighty)",
                "ratio": round(our_bytes / our_text, 2),
                "bytes_ms": round(our_bytes * 1e3, 3),
                "string_ms": round(our_text * 1e3, 3),
            },
        ]
    )


if __name__ == "__main__":
    main()
