"""Reads a TensorBoard event file with the tensorboard package's own reader (tests/monitor/tensorboard.cpp).

  read_tensorboard.py read FILE         per event read: "E <step> <wall_time>", then "F <file_version>" or
                                        a line "V <tag> <simple_value, repr>" per value
  read_tensorboard.py truncations FILE  for each k in 0..size, a line: the events read from the first k bytes,
                                        or "crash <error>" where the reader raised
"""
import os
import sys
import tempfile

from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
from tensorboard.compat.proto import event_pb2


def events(path):
    out = []
    for raw in RawEventFileLoader(path).Load():
        ev = event_pb2.Event.FromString(raw)
        item = {"wall_time": ev.wall_time, "step": ev.step}
        if ev.HasField("file_version"):
            item["file_version"] = ev.file_version
        if ev.HasField("summary"):
            item["values"] = [[v.tag, v.simple_value] for v in ev.summary.value]
        out.append(item)
    return out


def main():
    mode, path = sys.argv[1], sys.argv[2]
    if mode == "read":
        for e in events(path):
            print("E %d %r" % (e["step"], e["wall_time"]))
            if "file_version" in e:
                print("F " + e["file_version"])
            for tag, value in e.get("values", []):
                print("V %s %r" % (tag, value))
        return
    data = open(path, "rb").read()
    counts = []
    with tempfile.TemporaryDirectory() as d:
        cut = os.path.join(d, "events.out.tfevents.cut")
        for k in range(len(data) + 1):
            with open(cut, "wb") as f:
                f.write(data[:k])
            try:
                counts.append(len(events(cut)))
            except Exception as e:  # noqa: BLE001 - any exception is what the test reports
                counts.append("crash %s" % str(e).replace("\n", " "))
    for c in counts:
        print(c)


if __name__ == "__main__":
    main()
