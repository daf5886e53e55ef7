#!/usr/bin/env python3
"""Checks that the PromQL expressions shipped in contrib/prometheus (the
rules' and the Grafana dashboard's) use only series cogpu exports.

  prom-names.py --metrics FILE --rules RULES.yml --dashboard DASH.json
                [--prometheus URL] [--self-test]

FILE is real `cogpu metrics` output (not a hand list): its families, and
for histograms their _bucket/_sum/_count series, are the names allowed,
with the series the rules record and Prometheus's own `up`. With
--prometheus, every dashboard expression (Grafana's variables replaced) is
also sent to that Prometheus's /api/v1/query, which must parse it.
Exit 0 when all is well, 1 with the offending names on stderr.
Standard library and python3-yaml (installed by scripts/setup.sh).
"""
import argparse
import json
import re
import sys
import urllib.parse
import urllib.request

import yaml

KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring",
            "group_left", "group_right", "offset", "bool", "atan2", "inf",
            "nan", "Inf", "NaN"}
# Prometheus adds these to every target itself.
PROMETHEUS_OWN = {"up"}


def exported(text):
    """The series names in exposition text: each sample's, and each
    family's (TYPE), with a histogram's three series."""
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(None, 3)
            names.add(name)
            if kind.strip() == "histogram":
                names.update(name + s for s in ("_bucket", "_sum", "_count"))
        elif line and not line.startswith("#"):
            names.add(re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line).group(0))
    return names


def grafana_to_promql(expr):
    """Grafana's variables as Prometheus would see them."""
    expr = expr.replace("$__rate_interval", "1m").replace("$__interval", "1m")
    expr = expr.replace("$__range", "1h")
    return re.sub(r"\$\{?\w+\}?", ".*", expr)


def names_in(expr):
    """The metric names an expression selects: identifiers that are not
    functions (followed by a parenthesis), keywords, label names (inside
    braces or grouping lists), strings or durations."""
    e = re.sub(r'"(\\.|[^"\\])*"|\'(\\.|[^\'\\])*\'|`[^`]*`', '""', expr)
    e = re.sub(r"\{[^}]*\}", " ", e)          # label matchers
    e = re.sub(r"\[[^\]]*\]", " ", e)         # ranges, subqueries
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)",
               " ", e)
    e = re.sub(r"(?<![\w:])[0-9][0-9.eE+]*[a-zA-Z]*", " ", e)  # numbers, 5m
    names = set()
    for m in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", e):
        rest = e[m.end():].lstrip()
        if rest.startswith("(") or m.group(0) in KEYWORDS:
            continue
        names.add(m.group(0))
    return names


def dashboard_exprs(node):
    """Every PromQL expression in a dashboard: targets' expr, and the
    metric of a label_values() variable query."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "expr" and isinstance(v, str):
                yield v
            elif k in ("query", "definition") and isinstance(v, str):
                m = re.match(r"\s*label_values\((.*),\s*\w+\)\s*$", v)
                if m:
                    yield m.group(1)
            else:
                yield from dashboard_exprs(v)
    elif isinstance(node, list):
        for v in node:
            yield from dashboard_exprs(v)


def check(metrics_text, rules, dashboard, prometheus=None):
    allowed = exported(metrics_text) | PROMETHEUS_OWN
    exprs = []
    for group in rules.get("groups", []):
        for rule in group["rules"]:
            if "record" in rule:
                allowed.add(rule["record"])
            exprs.append(("rule " + rule.get("record", rule.get("alert", "")),
                          rule["expr"]))
    dash = list(dashboard_exprs(dashboard))
    exprs += [("dashboard", grafana_to_promql(e)) for e in dash]
    bad = []
    used = set()
    for where, expr in exprs:
        names = names_in(expr)
        if not names:
            bad.append("%s: selects no series: %s" % (where, expr))
        used |= names
        bad += ["%s: %s is not a series cogpu exports (in %s)" % (where, n, expr.strip())
                for n in sorted(names - allowed)]
    if not dash:
        bad.append("the dashboard has no expressions")
    if prometheus:
        for _, expr in exprs:
            url = prometheus + "/api/v1/query?" + urllib.parse.urlencode(
                {"query": expr})
            try:
                with urllib.request.urlopen(url, timeout=10) as r:
                    status = json.load(r).get("status")
            except Exception as e:  # an HTTP 400 carries the parse error
                status = "%s: %s" % (e, getattr(e, "read", lambda: b"")().decode())
            if status != "success":
                bad.append("Prometheus refuses %s: %s" % (expr.strip(), status))
    return bad, used


def self_test():
    text = ("# TYPE cogpu_up gauge\ncogpu_up 1\n"
            "# TYPE cogpu_wait_seconds histogram\n"
            'cogpu_wait_seconds_bucket{le="+Inf"} 0\n'
            "# TYPE cogpu_gpu_queue_length gauge\n")
    rules = {"groups": [{"rules": [
        {"record": "cogpu:x:sum", "expr": "sum by (gpu) (cogpu_gpu_queue_length)"}]}]}
    good = {"panels": [{"targets": [
        {"expr": 'histogram_quantile(0.9, sum by (le) (rate(cogpu_wait_seconds_bucket{instance=~"$instance"}[$__rate_interval])))'},
        {"expr": 'cogpu:x:sum > bool 1 and on (instance) up{job="cogpu"} offset 5m'}]}],
        "templating": {"list": [{"query": "label_values(cogpu_up, instance)"}]}}
    bad, used = check(text, rules, good)
    assert not bad, bad
    assert used == {"cogpu_wait_seconds_bucket", "cogpu:x:sum", "up",
                    "cogpu_up", "cogpu_gpu_queue_length"}, used
    for wrong in ('cogpu_gpu_reserved_byte', 'rate(cogpu_wait_second_sum[5m])',
                  'sum without (gpu) (cogpu_up) / cogpu_nope'):
        bad, _ = check(text, rules, {"panels": [{"targets": [{"expr": wrong}]}]})
        assert bad, wrong
    bad, _ = check(text, rules, {"templating": {"list": [
        {"query": "label_values(cogpu_nope, instance)"}]}})
    assert bad
    print("prom-names self-test: ok")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--metrics")
    ap.add_argument("--rules")
    ap.add_argument("--dashboard")
    ap.add_argument("--prometheus")
    ap.add_argument("--self-test", action="store_true")
    a = ap.parse_args()
    if a.self_test:
        self_test()
        return 0
    with open(a.metrics) as f:
        text = f.read()
    with open(a.rules) as f:
        rules = yaml.safe_load(f)
    with open(a.dashboard) as f:
        dashboard = json.load(f)
    bad, used = check(text, rules, dashboard, a.prometheus)
    for b in bad:
        print(b, file=sys.stderr)
    if not bad:
        print("%d series used, all exported: %s" % (len(used), " ".join(sorted(used))))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
