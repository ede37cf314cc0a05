"""Every scalar in a TensorBoard log directory, read by the tensorboard
package's own readers, printed as JSON: {tag: [[step, value], ...]}, points in
file order (files in name order, as TensorBoard reads them).

Two readers must agree: event_accumulator (the scalars as written, Summary
simple_value) and plugin_event_accumulator (what the TensorBoard server
plots: each simple_value migrated to a scalar tensor of the "scalars"
plugin). Both keep every point (size guidance 0), and both check every
record's CRCs, so a damaged file shows as missing points, not wrong ones.

Usage (python from scripts/python-venv.sh):
  tensorboard_dump.py LOGDIR                     prints the JSON
  tensorboard_dump.py LOGDIR --expect FILE.json  compares with FILE instead:
      the same tags with the same points in the same order, values equal as
      float32 (NaN equal to NaN); exit 1 naming the first difference
Output and FILE are Python's JSON (Infinity and NaN allowed)."""
import argparse
import json
import math
import os
import sys

from tensorboard.backend.event_processing import event_accumulator, plugin_event_accumulator
from tensorboard.util import tensor_util


def legacy_scalars(logdir):
    acc = event_accumulator.EventAccumulator(logdir, size_guidance=event_accumulator.STORE_EVERYTHING_SIZE_GUIDANCE)
    acc.Reload()
    return {tag: [[e.step, e.value] for e in acc.Scalars(tag)] for tag in acc.Tags()[event_accumulator.SCALARS]}


def plugin_scalars(logdir):
    acc = plugin_event_accumulator.EventAccumulator(
        logdir, size_guidance=plugin_event_accumulator.STORE_EVERYTHING_SIZE_GUIDANCE)
    acc.Reload()
    out = {}
    for tag in acc.Tags()[plugin_event_accumulator.TENSORS]:
        plugin = acc.SummaryMetadata(tag).plugin_data.plugin_name
        if plugin != "scalars":
            sys.exit(f"tensorboard_dump: {logdir}: tag {tag!r} is plugin {plugin!r}, not a scalar")
        out[tag] = [[e.step, tensor_util.make_ndarray(e.tensor_proto).item()] for e in acc.Tensors(tag)]
    return out


def same_value(a, b):
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def first_difference(want, got):
    """A sentence naming the first place got differs from want, or None."""
    for tag in sorted(set(want) | set(got)):
        if tag not in got:
            return f"tag {tag!r}: missing ({len(want[tag])} points written)"
        if tag not in want:
            return f"tag {tag!r}: read but never written"
        w, g = want[tag], got[tag]
        for i, (pw, pg) in enumerate(zip(w, g)):
            if pw[0] != pg[0] or not same_value(float(pw[1]), float(pg[1])):
                return f"tag {tag!r}, point {i}: wrote step {pw[0]} value {pw[1]!r}, read step {pg[0]} value {pg[1]!r}"
        if len(w) != len(g):
            return f"tag {tag!r}: wrote {len(w)} points, read {len(g)}"
    return None


def main():
    a = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    a.add_argument("logdir")
    a.add_argument("--expect", metavar="FILE.json")
    args = a.parse_args()
    files = [f for f in os.listdir(args.logdir) if "tfevents" in f] if os.path.isdir(args.logdir) else []
    if not files:
        sys.exit(f"tensorboard_dump: {args.logdir}: no events files")

    got = legacy_scalars(args.logdir)
    diff = first_difference(got, plugin_scalars(args.logdir))
    if diff:
        sys.exit(f"tensorboard_dump: {args.logdir}: the two readers disagree: {diff}")
    if args.expect is None:
        json.dump(got, sys.stdout, indent=1)
        print()
        return
    with open(args.expect) as f:
        want = json.load(f)
    diff = first_difference(want, got)
    if diff:
        sys.exit(f"tensorboard_dump: {args.logdir} against {args.expect}: {diff}")
    points = sum(len(v) for v in got.values())
    print(f"tensorboard_dump: {len(files)} events files, {len(got)} tags, {points} points as written")


if __name__ == "__main__":
    main()
