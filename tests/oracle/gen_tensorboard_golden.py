#!/usr/bin/env python3
"""Golden TensorBoard event records from the real `tensorboard` package (its own protos and record writer).

Run from anywhere; the script creates/updates its venv ($TB_VENV, default /tmp/tb-venv) from
tests/oracle/requirements-tensorboard.txt and re-runs itself there:

    python3 tests/oracle/gen_tensorboard_golden.py

Writes tests/golden/tensorboard/records.txt: one line per record, `name hex`, where hex is the whole
TFRecord frame (uint64 length, masked crc32c of it, the serialized `tensorboard.Event`, masked crc32c of
it) as tensorboard.summary.writer.record_writer.RecordWriter writes it. The inputs are fixed below and
repeated in tests/test_tensorboard.cpp; reruns give identical bytes.

Histograms use TensorFlow's default buckets (limits 0, +-1e-12 * 1.1^k below 1e20, +-DBL_MAX; runs of
empty buckets collapsed into one, as tensorflow/core/lib/histogram/histogram.cc's EncodeToProto does),
computed here independently of the C++ code.

check_tensorboard.py imports ensure_venv() from here.
"""

import bisect
import io
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
GOLDEN = os.path.join(ROOT, "tests", "golden", "tensorboard")
REQS = os.path.join(HERE, "requirements-tensorboard.txt")
VENV = os.environ.get("TB_VENV", "/tmp/tb-venv")


def ensure_venv(script):
    """Re-exec `script` under the venv, creating or updating it from requirements-tensorboard.txt first."""
    if os.path.realpath(sys.prefix) == os.path.realpath(VENV):
        return
    py = os.path.join(VENV, "bin", "python")
    stamp = os.path.join(VENV, "requirements-tensorboard.installed")
    with open(REQS) as f:
        wanted = f.read()
    if not (os.path.exists(stamp) and open(stamp).read() == wanted):
        if not os.path.exists(py):
            subprocess.check_call([sys.executable, "-m", "venv", VENV])
        subprocess.check_call([py, "-m", "pip", "install", "-q", "-r", REQS])
        with open(stamp, "w") as f:
            f.write(wanted)
    os.execv(py, [py, os.path.abspath(script)] + sys.argv[1:])


def versions():
    import importlib.metadata as md
    out = {p: md.version(p) for p in ["tensorboard", "protobuf", "numpy"]}
    out["python"] = sys.version.split()[0]
    return out


DBL_MAX = sys.float_info.max


def default_bucket_limits():
    pos = []
    v = 1.0e-12
    while v < 1.0e20:
        pos.append(v)
        v *= 1.1
    pos.append(DBL_MAX)
    return [-x for x in reversed(pos)] + [0.0] + pos


def histogram_proto(values):
    from tensorboard.compat.proto import summary_pb2

    limits = default_bucket_limits()
    counts = [0.0] * len(limits)
    lo, hi, num, total, squares = DBL_MAX, -DBL_MAX, 0.0, 0.0, 0.0
    for x in values:
        x = float(x)
        counts[min(bisect.bisect_right(limits, x), len(limits) - 1)] += 1.0
        lo, hi = min(lo, x), max(hi, x)
        num += 1.0
        total += x
        squares += x * x
    out_limits, out_counts = [], []
    i = 0
    while i < len(counts):
        end, count = limits[i], counts[i]
        i += 1
        if count <= 0.0:
            while i < len(counts) and counts[i] <= 0.0:
                end, count = limits[i], counts[i]
                i += 1
        out_limits.append(end)
        out_counts.append(count)
    return summary_pb2.HistogramProto(min=lo, max=hi, num=num, sum=total, sum_squares=squares,
                                      bucket_limit=out_limits, bucket=out_counts)


# The fixed inputs; tests/test_tensorboard.cpp repeats them.
HIST_VALUES = [-3.5, -1e-13, 0.0, 0.0, 1e-12, 0.5, 1.0, 1.0, 1.0, 2.25, 123.456, 1e6, -42.0, 7e-5]
TEXT = "hello **markdown**\nline 2 \u2014 \u00fcn\u00efc\u00f6d\u00e9"


def records():
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.plugins.text import summary_v2 as text_summary

    def scalar(tag, value, step, wall_time):
        v = summary_pb2.Summary.Value(tag=tag, simple_value=value)
        return event_pb2.Event(wall_time=wall_time, step=step, summary=summary_pb2.Summary(value=[v]))

    def histo(tag, values, step, wall_time):
        v = summary_pb2.Summary.Value(tag=tag, histo=histogram_proto(values))
        return event_pb2.Event(wall_time=wall_time, step=step, summary=summary_pb2.Summary(value=[v]))

    return [
        ("file_version", event_pb2.Event(wall_time=1700000000.5, file_version="brain.Event:2",
                                         source_metadata=event_pb2.SourceMetadata(writer="levanter.tensorboard"))),
        ("scalar", scalar("train/loss", 2.718281828, 42, 1700000001.25)),
        ("scalar_zero", scalar("train/zero", 0.0, 0, 1700000002.0)),
        ("scalar_big_step", scalar("train/learning_rate", 3e-4, 2**40 + 3, 1700000003.125)),
        ("scalar_negative", scalar("eval/delta", -1.5e-7, 5, 1700000004.0)),
        ("histogram", histo("params/weights", HIST_VALUES, 100, 1700000005.5)),
        ("histogram_empty", histo("params/empty", [], 101, 1700000006.0)),
        ("text", event_pb2.Event(wall_time=1700000007.75, step=7, summary=text_summary.text_pb("config/text", TEXT))),
    ]


def main():
    from tensorboard.summary.writer.record_writer import RecordWriter

    os.makedirs(GOLDEN, exist_ok=True)
    v = versions()
    lines = ["# TFRecord-framed tensorboard.Event records written by tests/oracle/gen_tensorboard_golden.py with "
             + ", ".join(f"{k} {v[k]}" for k in v),
             "# format: name hex-of-the-whole-record (length, masked crc, Event bytes, masked crc)"]
    for name, event in records():
        buf = io.BytesIO()
        RecordWriter(buf).write(event.SerializeToString())
        lines.append(f"{name} {buf.getvalue().hex()}")
        print(f"{name}: {len(buf.getvalue())} bytes")
    with open(os.path.join(GOLDEN, "records.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("wrote", os.path.join(GOLDEN, "records.txt"))


if __name__ == "__main__":
    ensure_venv(__file__)
    main()
