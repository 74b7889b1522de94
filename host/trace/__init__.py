"""Trace files: every nondeterministic input of a run, recorded so the run can be replayed.

``TraceWriter`` appends checksummed frames as a run goes; ``TraceReader``/``read_trace`` read
them back and tell a torn tail (``truncated``) from damage (``TraceCorrupt``). ``encode_value``
and ``decode_value`` are the lossless value encoding the records use.
"""

from mighty.trace._across import AcrossReport, Segment, migration_link, replay_across
from mighty.trace._answer import (
    AnsweredImport,
    AnswerPolicy,
    LiveFrom,
    TraceAnswers,
    answer_gate,
    read_instances,
)
from mighty.trace._debug import Debugger
from mighty.trace._errors import (
    TraceCorrupt,
    TraceError,
    TraceInvalid,
    TraceTruncated,
    TraceVersionError,
)
from mighty.trace._format import (
    FLUSH_MODES,
    FORMAT_VERSION,
    MAX_FRAME,
    FlushMode,
    Trace,
    TraceReader,
    TraceWriter,
    read_trace,
)
from mighty.trace._recorder import InstanceRecording, Recorder, default_trace_path
from mighty.trace._replay import (
    DEFAULT_REPLAY_LIMITS,
    InstanceReport,
    NondeterminismError,
    ReplayAborted,
    ReplayEvent,
    ReplayLimitExceeded,
    ReplayLimits,
    ReplayReport,
    replay_trace,
)
from mighty.trace._summary import summarize
from mighty.trace._timeline import write_chrome_trace, write_html
from mighty.trace._values import HandleRef, decode_value, encode_value

__all__ = [
    "DEFAULT_REPLAY_LIMITS",
    "FLUSH_MODES",
    "FORMAT_VERSION",
    "MAX_FRAME",
    "AcrossReport",
    "AnswerPolicy",
    "AnsweredImport",
    "Debugger",
    "FlushMode",
    "HandleRef",
    "InstanceRecording",
    "InstanceReport",
    "LiveFrom",
    "NondeterminismError",
    "Recorder",
    "ReplayAborted",
    "ReplayEvent",
    "ReplayLimitExceeded",
    "ReplayLimits",
    "ReplayReport",
    "Segment",
    "Trace",
    "TraceAnswers",
    "TraceCorrupt",
    "TraceError",
    "TraceInvalid",
    "TraceReader",
    "TraceTruncated",
    "TraceVersionError",
    "TraceWriter",
    "answer_gate",
    "decode_value",
    "default_trace_path",
    "encode_value",
    "migration_link",
    "read_instances",
    "read_trace",
    "replay_across",
    "replay_trace",
    "summarize",
    "write_chrome_trace",
    "write_html",
]
