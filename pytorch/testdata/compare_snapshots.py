"""Compares PyTorch memory snapshots as Python values, standard library only.

Usage: compare_snapshots.py ORIGINAL COPY [ORIGINAL COPY ...]

ORIGINAL@N compares COPY with device N of ORIGINAL alone: its segments,
its trace (the others' traces empty) and its annotations. Prints one JSON object: for each COPY, "equal" (the two unpickle to equal
values, ==), "diffs" (paths where the values differ, at most 20) and
"order" (paths of dicts whose keys come in another order, at most 20).
Pickles that name a global (to import or call code) are refused.
"""
import gzip, io, json, pickle, sys

class DataOnly(pickle.Unpickler):
    """Refuses every global, so nothing can be imported or called (the
    way the pickle documentation restricts globals)."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError("refused: the pickle names %s.%s" % (module, name))


def load(path):
    data = open(path, "rb").read()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    if data[:1] in (b"{", b"["):
        return json.loads(data)
    return DataOnly(io.BytesIO(data)).load()


def only_device(s, n):
    s = dict(s)
    s["segments"] = [seg for seg in s["segments"] if seg["device"] == n]
    if "device_traces" in s:
        s["device_traces"] = [t if d == n else [] for d, t in enumerate(s["device_traces"])]
    if "external_annotations" in s:
        s["external_annotations"] = [a for a in s["external_annotations"] if a["device"] == n]
    return s


def walk(a, b, path, diffs, order, seen):
    # path is (parent's path, key), spelled out (where) only for a
    # difference: a snapshot has millions of values.
    if len(diffs) >= 20:
        return
    if isinstance(a, (dict, list, tuple)):
        # Snapshots share frames and stacks: compare each pair once.
        if (id(a), id(b)) in seen:
            return
        seen.add((id(a), id(b)))
    if type(a) is not type(b):
        diffs.append("%s: %s %s, then %s %s" % (where(path), type(a).__name__, short(a), type(b).__name__, short(b)))
    elif isinstance(a, dict):
        if list(a) != list(b) and set(a) == set(b) and len(order) < 20:
            order.append("%s: %s, then %s" % (where(path), list(a), list(b)))
        for k in a:
            if k not in b:
                diffs.append("%s: key %r missing" % (where(path), k))
            else:
                walk(a[k], b[k], (path, repr(k)), diffs, order, seen)
        for k in b:
            if k not in a:
                diffs.append("%s: key %r added (%s)" % (where(path), k, short(b[k])))
    elif isinstance(a, (list, tuple)):
        if len(a) != len(b):
            diffs.append("%s: %d items, then %d" % (where(path), len(a), len(b)))
        for i, (x, y) in enumerate(zip(a, b)):
            walk(x, y, (path, i), diffs, order, seen)
    elif a != b:
        diffs.append("%s: %s, then %s" % (where(path), short(a), short(b)))


def where(path):
    keys = []
    while path:
        path, k = path
        keys.append("[%s]" % k)
    return "".join(reversed(keys))


def short(v):
    r = repr(v)
    return r if len(r) < 80 else r[:77] + "..."


out = {}
args = sys.argv[1:]
for orig, copy in zip(args[::2], args[1::2]):
    path, _, device = orig.partition("@")
    a, b = load(path), load(copy)
    if device:
        a = only_device(a, int(device))
    diffs, order = [], []
    walk(a, b, (), diffs, order, set())
    out[copy] = {"equal": a == b, "diffs": diffs, "order": order}
json.dump(out, sys.stdout, indent=1)
