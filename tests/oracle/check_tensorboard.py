#!/usr/bin/env python3
"""Loads a TensorBoard run directory with the real `tensorboard` package and checks what it finds.

    python3 tests/oracle/check_tensorboard.py LOGDIR [--expect TAG=COUNT ...] [--serve]
    python3 tests/oracle/check_tensorboard.py --self-test

Runs in the venv of gen_tensorboard_golden.py ($TB_VENV, default /tmp/tb-venv). For LOGDIR (one run: the
event files directly in it) it
  - walks every events.out.tfevents.* file record by record (length and both masked CRC-32Cs, with
    tensorboard's own crc code) and parses each record as a tensorboard.Event;
  - loads the directory with event_accumulator.EventAccumulator (size_guidance 0 = keep everything) and
    prints every scalar, histogram and tensor tag with its count, steps and values;
  - checks: file_version "brain.Event:2" first in each file, finite scalars, histograms whose bucket counts
    add up to num with sorted limits and min <= max, that data_compat turns each histogram into a [k, 3]
    tensor holding num values, text tensors (plugin "text") of DT_STRING that decode as UTF-8, and for
    every --expect TAG=COUNT exactly COUNT events under TAG.
With --serve it then starts the real `tensorboard` server (--load_fast=false) on a free local port and
asks its HTTP API (/data/plugin/{scalars,histograms,text}/...) for every tag: the counts must match.
Exits 1 and says why on any problem. --self-test runs the checks on a run written by tensorboard's own
EventFileWriter and on a copy with one flipped byte (which must fail).
"""

import glob
import math
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_tensorboard_golden import ensure_venv, versions  # noqa: E402


def walk_records(path, problems):
    from tensorboard.compat.proto import event_pb2
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    data = open(path, "rb").read()
    events, at = [], 0
    while at < len(data):
        if len(data) - at < 12:
            problems.append(f"{path}: truncated record header at byte {at}")
            break
        (length,) = struct.unpack_from("<Q", data, at)
        (len_crc,) = struct.unpack_from("<I", data, at + 8)
        if masked_crc32c(data[at:at + 8]) != len_crc:
            problems.append(f"{path}: bad length crc at byte {at}")
            break
        if len(data) - at - 12 < length + 4:
            problems.append(f"{path}: truncated record at byte {at}")
            break
        payload = data[at + 12:at + 12 + length]
        (data_crc,) = struct.unpack_from("<I", data, at + 12 + length)
        if masked_crc32c(payload) != data_crc:
            problems.append(f"{path}: bad data crc at byte {at}")
            break
        event = event_pb2.Event()
        event.ParseFromString(payload)
        events.append(event)
        at += 16 + length
    if events and events[0].file_version != "brain.Event:2":
        problems.append(f"{path}: first event has file_version {events[0].file_version!r}, not 'brain.Event:2'")
    if not events:
        problems.append(f"{path}: no events")
    return events


def check(logdir, expect, serve=False):
    import numpy as np
    from tensorboard import data_compat
    from tensorboard.backend.event_processing import event_accumulator as ea
    from tensorboard.compat.proto import summary_pb2, types_pb2
    from tensorboard.util import tensor_util

    problems = []
    files = sorted(glob.glob(os.path.join(logdir, "*tfevents*")))
    if not files:
        return [f"{logdir}: no event files"]
    for path in files:
        before = len(problems)
        events = walk_records(path, problems)
        ok = "framing and CRCs ok" if len(problems) == before else "BAD"
        print(f"{os.path.basename(path)}: {len(events)} records read, {ok}")

    acc = ea.EventAccumulator(logdir, size_guidance={k: 0 for k in ea.DEFAULT_SIZE_GUIDANCE})
    acc.Reload()
    tags = acc.Tags()
    print(f"EventAccumulator: file_version {acc.file_version}, first event at {acc.FirstEventTimestamp():.3f}")
    if acc.file_version != 2.0:
        problems.append(f"file_version {acc.file_version}, expected 2")
    counts = {}
    by_kind = {"scalars": {}, "histograms": {}, "text": {}}

    for tag in tags["scalars"]:
        ev = acc.Scalars(tag)
        counts[tag] = by_kind["scalars"][tag] = len(ev)
        vals = [e.value for e in ev]
        print(f"  scalar {tag}: {len(ev)} events, steps {ev[0].step}..{ev[-1].step}, "
              f"first {vals[0]:.6g}, last {vals[-1]:.6g}, min {min(vals):.6g}, max {max(vals):.6g}")
        if not all(math.isfinite(v) for v in vals):
            problems.append(f"scalar {tag}: non-finite values")
        if not all(math.isfinite(e.wall_time) and e.wall_time > 0 for e in ev):
            problems.append(f"scalar {tag}: bad wall_time")

    for tag in tags["histograms"]:
        ev = acc.Histograms(tag)
        counts[tag] = by_kind["histograms"][tag] = len(ev)
        for e in ev:
            h = e.histogram_value
            where = f"histogram {tag} step {e.step}"
            print(f"  {where}: num {h.num:g}, min {h.min:.6g}, max {h.max:.6g}, sum {h.sum:.6g}, "
                  f"{len(h.bucket)} buckets ({sum(1 for c in h.bucket if c > 0)} non-empty)")
            if len(h.bucket) != len(h.bucket_limit) or not h.bucket:
                problems.append(f"{where}: {len(h.bucket)} counts for {len(h.bucket_limit)} limits")
            if sum(h.bucket) != h.num:
                problems.append(f"{where}: bucket counts add up to {sum(h.bucket)}, num is {h.num}")
            if list(h.bucket_limit) != sorted(h.bucket_limit):
                problems.append(f"{where}: bucket limits not sorted")
            if h.num > 0 and not h.min <= h.max:
                problems.append(f"{where}: min {h.min} > max {h.max}")
            # What the histogram dashboard does with it.
            proto = summary_pb2.HistogramProto(min=h.min, max=h.max, num=h.num, sum=h.sum,
                                               sum_squares=h.sum_squares, bucket_limit=h.bucket_limit,
                                               bucket=h.bucket)
            migrated = data_compat.migrate_value(summary_pb2.Summary.Value(tag=tag, histo=proto))
            arr = tensor_util.make_ndarray(migrated.tensor)
            plugin = migrated.metadata.plugin_data.plugin_name
            if plugin != "histograms" or arr.ndim != 2 or arr.shape[1] != 3 or arr[:, 2].sum() != h.num:
                problems.append(f"{where}: data_compat gives plugin {plugin!r}, shape {arr.shape}")
            elif len(arr) and not (np.all(arr[:, 0] <= arr[:, 1]) and arr[0, 0] == np.float32(h.min)
                                   and arr[-1, 1] == np.float32(h.max)):
                problems.append(f"{where}: dashboard bins run backwards or miss min/max")
            else:
                print(f"    dashboard: {arr.shape[0]} bins [{arr[0, 0] if len(arr) else 0:.6g}, "
                      f"{arr[-1, 1] if len(arr) else 0:.6g}]")

    for tag in tags["tensors"]:
        ev = acc.Tensors(tag)
        counts[tag] = len(ev)
        plugin = acc.SummaryMetadata(tag).plugin_data.plugin_name
        if plugin == "text":
            by_kind["text"][tag] = len(ev)
        for e in ev:
            t = e.tensor_proto
            where = f"tensor {tag} step {e.step} (plugin {plugin!r})"
            if plugin == "text":
                if t.dtype != types_pb2.DT_STRING:
                    problems.append(f"{where}: dtype {t.dtype}, not DT_STRING")
                    continue
                arr = tensor_util.make_ndarray(t)
                try:
                    texts = [x.decode("utf-8") for x in arr.reshape(-1)]
                except UnicodeDecodeError:
                    problems.append(f"{where}: not UTF-8")
                    continue
                print(f"  text {tag} step {e.step}: shape {list(arr.shape)}, {texts!r}")
            else:
                print(f"  {where}: dtype {t.dtype}")

    for spec in expect:
        tag, _, n = spec.rpartition("=")
        if counts.get(tag) != int(n):
            problems.append(f"--expect {spec}: found {counts.get(tag, 0)} events under {tag!r}")
    if not counts:
        problems.append("no scalar, histogram or tensor tags")
    if serve and not problems:
        problems += serve_check(logdir, by_kind)
    return problems


def serve_check(logdir, tags_by_kind):
    """Starts the real `tensorboard` server on LOGDIR and asks its HTTP API for every tag."""
    import json
    import socket
    import subprocess
    import time
    import urllib.parse
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exe = os.path.join(os.path.dirname(sys.executable), "tensorboard")
    proc = subprocess.Popen([exe, "--logdir", logdir, "--host", "127.0.0.1", "--port", str(port),
                             "--load_fast=false", "--reload_interval", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"

    def get(path, **query):
        url = base + path + ("?" + urllib.parse.urlencode(query) if query else "")
        with urllib.request.urlopen(url, timeout=10) as r:
            return json.load(r)

    problems = []
    try:
        runs, deadline = [], time.time() + 90
        while time.time() < deadline:
            try:
                runs = get("/data/runs")
                # a run shows up once its tags are loaded
                if runs and all(t in get("/data/plugin/scalars/tags").get(runs[0], {})
                                for t in tags_by_kind["scalars"]):
                    break
            except OSError:
                pass
            time.sleep(1)
        if not runs:
            return ["tensorboard server: no runs"]
        run = runs[0]
        print(f"tensorboard server on port {port}: runs {runs}")
        for tag, n in tags_by_kind["scalars"].items():
            d = get("/data/plugin/scalars/scalars", run=run, tag=tag)
            print(f"  /data/plugin/scalars/scalars {tag}: {len(d)} points")
            if len(d) != n:
                problems.append(f"server scalars {tag}: {len(d)} points, accumulator has {n}")
        for tag, n in tags_by_kind["histograms"].items():
            d = get("/data/plugin/histograms/histograms", run=run, tag=tag)
            print(f"  /data/plugin/histograms/histograms {tag}: {len(d)} steps, {[len(x[2]) for x in d]} bins")
            if len(d) != n:
                problems.append(f"server histograms {tag}: {len(d)} steps, accumulator has {n}")
        for tag, n in tags_by_kind["text"].items():
            d = get("/data/plugin/text/text", run=run, tag=tag)
            print(f"  /data/plugin/text/text {tag}: {len(d)} entries, first as HTML {d[0]['text'][:60]!r}"
                  if d else f"  text {tag}: none")
            if len(d) != n:
                problems.append(f"server text {tag}: {len(d)} entries, accumulator has {n}")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return problems


def self_test():
    import shutil
    import tempfile

    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.plugins.text import summary_v2 as text_summary
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    from gen_tensorboard_golden import histogram_proto

    tmp = tempfile.mkdtemp()
    try:
        good = os.path.join(tmp, "good")
        w = EventFileWriter(good)
        for step in range(10):
            s = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag="loss", simple_value=1.0 / (1 + step))])
            w.add_event(event_pb2.Event(wall_time=1e9 + step, step=step, summary=s))
        s = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag="w", histo=histogram_proto([1.0, -2.0, 3.5]))])
        w.add_event(event_pb2.Event(wall_time=1e9 + 20, step=20, summary=s))
        w.add_event(event_pb2.Event(wall_time=1e9 + 21, step=21, summary=text_summary.text_pb("notes", "hi")))
        w.close()
        problems = check(good, ["loss=10", "w=1", "notes=1"])
        if problems:
            return ["self-test, tensorboard's own file: " + p for p in problems]
        if not check(good, ["loss=11"]):
            return ["self-test: a wrong --expect passed"]
        bad = os.path.join(tmp, "bad")
        shutil.copytree(good, bad)
        (path,) = glob.glob(os.path.join(bad, "*tfevents*"))
        data = bytearray(open(path, "rb").read())
        data[len(data) // 2] ^= 0x01
        open(path, "wb").write(bytes(data))
        if not check(bad, []):
            return ["self-test: a flipped byte passed"]
        print("self-test ok")
        return []
    finally:
        shutil.rmtree(tmp)


def main():
    args = sys.argv[1:]
    print("versions:", ", ".join(f"{k} {v}" for k, v in versions().items()))
    if args == ["--self-test"]:
        problems = self_test()
    else:
        expect, dirs, i, serve = [], [], 0, False
        while i < len(args):
            if args[i] == "--serve":
                serve = True
                i += 1
            elif args[i] == "--expect" and i + 1 < len(args):
                expect.append(args[i + 1])
                i += 2
            elif args[i].startswith("--expect="):
                expect.append(args[i][len("--expect="):])
                i += 1
            else:
                dirs.append(args[i])
                i += 1
        if len(dirs) != 1:
            print(__doc__)
            sys.exit(2)
        problems = check(dirs[0], expect, serve)
    for p in problems:
        print("PROBLEM:", p)
    print("FAILED" if problems else "OK")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    ensure_venv(__file__)
    main()
