#!/usr/bin/env python3
"""prom-check.py: checks that a file is valid Prometheus text exposition
(format 0.0.4) and follows cogpu's naming conventions. Standard library
only, so the tests need nothing beyond python3.

  prom-check.py FILE [--prefix cogpu_]     exit 0 if valid, else 1 with
                                           one line per problem on stderr
  prom-check.py FILE --get 'name{a="b"}'   also prints that sample's value

What it checks (and why): metric and label names have the format's syntax;
each family has at most one HELP and one TYPE, both before its samples, and
its samples are contiguous (Prometheus' parser refuses a family split in
two); label values use only the three escapes the format has (\\\\, \\", \\n)
and the file is UTF-8; no label name repeats in a sample and no series
(name and label set) repeats; values are floats; counters are non-negative
and end in _total; a histogram has, per label set, buckets whose bounds rise
and whose counts do not fall, a +Inf bucket equal to _count, and a _sum;
with --prefix every family starts with it.
"""
import math
import re
import sys

NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
TYPES = {"counter", "gauge", "histogram", "summary", "untyped"}


def parse_value(s):
    if s in ("+Inf", "Inf"):
        return math.inf
    if s == "-Inf":
        return -math.inf
    if s == "NaN":
        return math.nan
    if not re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", s):
        raise ValueError("not a float: %r" % s)
    return float(s)


def parse_labels(s, i, errs, ln):
    """Parses {a="b",...} from s[i] == '{'; returns (labels, next index)."""
    labels = []
    i += 1
    while True:
        if i < len(s) and s[i] == "}":
            return labels, i + 1
        m = LABEL.match(s, i)
        if not m:
            errs.append("%d: bad label name at %r" % (ln, s[i:i + 20]))
            return None, i
        name = m.group(0)
        if name.startswith("__"):
            errs.append("%d: label name %s is reserved" % (ln, name))
        i = m.end()
        if s[i:i + 2] != '="':
            errs.append("%d: expected =\" after label %s" % (ln, name))
            return None, i
        i += 2
        val = []
        while True:
            if i >= len(s):
                errs.append("%d: unterminated label value" % ln)
                return None, i
            c = s[i]
            if c == "\\":
                nxt = s[i + 1:i + 2]
                if nxt not in ("\\", '"', "n"):
                    errs.append("%d: bad escape \\%s in label %s" %
                                (ln, nxt, name))
                    return None, i
                val.append({"\\": "\\", '"': '"', "n": "\n"}[nxt])
                i += 2
            elif c == '"':
                i += 1
                break
            else:
                val.append(c)
                i += 1
        labels.append((name, "".join(val)))
        if i < len(s) and s[i] == ",":
            i += 1
        elif i < len(s) and s[i] == "}":
            continue
        else:
            errs.append("%d: expected , or } after label %s" % (ln, name))
            return None, i


def family_of(name, types):
    """The family a sample belongs to (histogram samples have suffixes)."""
    for suf in ("_bucket", "_sum", "_count"):
        base = name[:-len(suf)]
        if name.endswith(suf) and types.get(base) in ("histogram", "summary"):
            return base
    return name


def check(text, prefix=None):
    errs = []
    samples = {}
    helps, types = {}, {}
    done = set()  # families whose samples are over
    current = None
    if text and not text.endswith("\n"):
        errs.append("the last line does not end in a newline")
    hist = {}  # (family, labels without le) -> {"b": [(le, v)], ...}
    for ln, line in enumerate(text.split("\n")[:-1] if text else [], 1):
        if line.startswith("#"):
            parts = line.split(" ", 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                name = parts[2]
                if not NAME.fullmatch(name):
                    errs.append("%d: bad metric name %r" % (ln, name))
                    continue
                seen = helps if parts[1] == "HELP" else types
                if name in seen:
                    errs.append("%d: second %s for %s" % (ln, parts[1], name))
                if name in done or current == name:
                    errs.append("%d: %s for %s after its samples" %
                                (ln, parts[1], name))
                if parts[1] == "TYPE":
                    t = parts[3] if len(parts) > 3 else ""
                    if t not in TYPES:
                        errs.append("%d: bad type %r" % (ln, t))
                    seen[name] = t
                else:
                    h = parts[3] if len(parts) > 3 else ""
                    if re.search(r"\\[^\\n]", h.replace("\\\\", "")):
                        errs.append("%d: bad escape in HELP" % ln)
                    seen[name] = h
            continue
        if not line.strip():
            continue
        m = NAME.match(line)
        if not m:
            errs.append("%d: bad metric name in %r" % (ln, line[:40]))
            continue
        name = m.group(0)
        i = m.end()
        labels = []
        if i < len(line) and line[i] == "{":
            labels, i = parse_labels(line, i, errs, ln)
            if labels is None:
                continue
        rest = line[i:].split(" ")
        if not rest or rest[0] != "" or len(rest) not in (2, 3):
            errs.append("%d: expected ' value [timestamp]' in %r" %
                        (ln, line[:60]))
            continue
        try:
            v = parse_value(rest[1])
        except ValueError as e:
            errs.append("%d: %s" % (ln, e))
            continue
        names = [k for k, _ in labels]
        if len(set(names)) != len(names):
            errs.append("%d: a label repeats in %s" % (ln, name))
        fam = family_of(name, types)
        if prefix and not fam.startswith(prefix):
            errs.append("%d: %s does not start with %s" % (ln, fam, prefix))
        if fam != current:
            if fam in done:
                errs.append("%d: samples of %s are not together" % (ln, fam))
            if current:
                done.add(current)
            current = fam
        if fam not in types:
            errs.append("%d: %s has no TYPE" % (ln, fam))
        if fam not in helps:
            errs.append("%d: %s has no HELP" % (ln, fam))
        key = (name, tuple(sorted(labels)))
        if key in samples:
            errs.append("%d: series repeats: %s%s" % (ln, name, labels))
        samples[key] = v
        t = types.get(fam)
        if t == "counter":
            if not fam.endswith("_total"):
                errs.append("%d: counter %s does not end in _total" %
                            (ln, fam))
            if not v >= 0:
                errs.append("%d: counter %s is %s" % (ln, name, v))
        elif t == "gauge" and fam.endswith("_total"):
            errs.append("%d: gauge %s ends in _total" % (ln, fam))
        if t == "histogram":
            le = dict(labels).get("le")
            rest_l = tuple(sorted((k, x) for k, x in labels if k != "le"))
            h = hist.setdefault((fam, rest_l), {"b": []})
            if name == fam + "_bucket":
                if le is None:
                    errs.append("%d: bucket without le" % ln)
                    continue
                try:
                    h["b"].append((parse_value(le), v, ln))
                except ValueError:
                    errs.append("%d: bad le %r" % (ln, le))
            elif name == fam + "_sum":
                h["sum"] = v
            elif name == fam + "_count":
                h["count"] = v
            else:
                errs.append("%d: %s is not part of histogram %s" %
                            (ln, name, fam))
    for (fam, labels), h in hist.items():
        b = h["b"]
        for (le0, v0, _), (le1, v1, ln) in zip(b, b[1:]):
            if not le1 > le0:
                errs.append("%d: %s bucket bounds do not rise" % (ln, fam))
            if v1 < v0:
                errs.append("%d: %s bucket counts fall" % (ln, fam))
        if not b or b[-1][0] != math.inf:
            errs.append("%s%s: no +Inf bucket" % (fam, labels))
        elif h.get("count") != b[-1][1]:
            errs.append("%s%s: +Inf bucket %s != _count %s" %
                        (fam, labels, b[-1][1], h.get("count")))
        if "sum" not in h:
            errs.append("%s%s: no _sum" % (fam, labels))
    return errs, samples


def series_key(spec):
    """'name{a="b",c="d"}' -> the key check() uses."""
    m = NAME.match(spec)
    labels = []
    if m.end() < len(spec):
        labels, _ = parse_labels(spec, m.end(), [], 0)
    return (m.group(0), tuple(sorted(labels)))


# Each must be refused: the checker is itself checked (--self-test), so a
# checker that accepts everything cannot pass the tests.
BAD = [
    "x 1",  # no newline at the end
    "# TYPE a gauge\n# HELP a h\na 1\n# TYPE a gauge\n",
    "# HELP a h\n# TYPE a gauge\na 1\n# HELP b h\n# TYPE b gauge\nb 1\na 2\n",
    "# HELP a h\n# TYPE a gauge\na 1\n# HELP a again\n",
    "# HELP 1a h\n# TYPE 1a gauge\n1a 1\n",
    '# HELP a h\n# TYPE a gauge\na{1b="x"} 1\n',
    '# HELP a h\n# TYPE a gauge\na{b="x\\t"} 1\n',
    '# HELP a h\n# TYPE a gauge\na{b="x} 1\n',
    '# HELP a h\n# TYPE a gauge\na{b="x",b="y"} 1\n',
    '# HELP a h\n# TYPE a gauge\na{b="x"} 1\na{b="x"} 2\n',
    "# HELP a h\n# TYPE a gauge\na one\n",
    "# HELP a_total h\n# TYPE a_total counter\na_total -1\n",
    "# HELP a h\n# TYPE a counter\na 1\n",
    "# HELP a h\n# TYPE a gauge\n",  # fine alone; with the next line not
    "a 1\n",  # no HELP or TYPE
    "# HELP h h\n# TYPE h histogram\nh_bucket{le=\"1\"} 2\n"
    "h_bucket{le=\"0.5\"} 3\nh_bucket{le=\"+Inf\"} 3\nh_sum 1\nh_count 3\n",
    "# HELP h h\n# TYPE h histogram\nh_bucket{le=\"1\"} 2\n"
    "h_bucket{le=\"2\"} 1\nh_bucket{le=\"+Inf\"} 3\nh_sum 1\nh_count 3\n",
    "# HELP h h\n# TYPE h histogram\nh_bucket{le=\"1\"} 2\n"
    "h_bucket{le=\"+Inf\"} 3\nh_sum 1\nh_count 4\n",
    "# HELP h h\n# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_sum 1\n"
    "h_count 2\n",
    "# HELP h h\n# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_count 2\n",
]
GOOD = [
    "",
    "# HELP a h\n# TYPE a gauge\na 1\n",
    '# HELP a_total h \\\\ \\n\n# TYPE a_total counter\n'
    'a_total{b="q\\"\\\\\\n",c=""} 0\na_total{b="y"} 1e3\n',
    "# HELP h h\n# TYPE h histogram\nh_bucket{le=\"1\"} 2\n"
    "h_bucket{le=\"+Inf\"} 3\nh_sum 1.5\nh_count 3\n",
]


def self_test():
    ok = True
    for i, t in enumerate(BAD):
        if i == 13:
            t = t + "b 1\n"
        errs, _ = check(t, None)
        if not errs:
            print("prom-check: self-test: accepted bad input %d: %r" % (i, t),
                  file=sys.stderr)
            ok = False
    for t in GOOD:
        errs, _ = check(t, None)
        if errs:
            print("prom-check: self-test: refused good input %r: %s" %
                  (t, errs), file=sys.stderr)
            ok = False
    if check("# HELP b h\n# TYPE b gauge\nb 1\n", "cogpu_")[0] == []:
        print("prom-check: self-test: --prefix not enforced", file=sys.stderr)
        ok = False
    return 0 if ok else 1


def main(argv):
    if len(argv) == 2 and argv[1] == "--self-test":
        return self_test()
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    prefix, get = None, []
    args = argv[2:]
    while args:
        if args[0] == "--prefix" and len(args) > 1:
            prefix = args[1]
        elif args[0] == "--get" and len(args) > 1:
            get.append(args[1])
        else:
            print("prom-check: bad arguments", file=sys.stderr)
            return 2
        args = args[2:]
    raw = open(argv[1], "rb").read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        print("prom-check: not UTF-8: %s" % e, file=sys.stderr)
        return 1
    errs, samples = check(text, prefix)
    for e in errs:
        print("prom-check: %s" % e, file=sys.stderr)
    for g in get:
        v = samples.get(series_key(g))
        print("%s %s" % (g, "absent" if v is None else repr(v)))
    return 1 if errs else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
