#!/usr/bin/env python3
"""Renders a Helm chart as `helm template` does, with Helm's own engine (Helm's Go SDK through
the helm-python-sdk wheel from PyPI: Helm itself is not in Debian). Prints the manifests as one
YAML stream, NOTES.txt left out.

    ~/.cache/railguard/helm/bin/python scripts/helm_template.py CHART [-f VALUES]... \
        [--name NAME] [--namespace NS]

scripts/setup.sh makes that environment; e2e/tests/deploy.rs renders deploy/helm/railguard so.
"""
import argparse
import sys

import helm_python
import yaml


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("chart")
    p.add_argument("-f", "--values", action="append", default=[], help="a values file (later ones win)")
    p.add_argument("--name", default="railguard")
    p.add_argument("--namespace", default="railguard")
    args = p.parse_args()
    values = {}
    for path in args.values:
        with open(path, encoding="utf-8") as f:
            values = merge(values, yaml.safe_load(f) or {})
    chart = helm_python.Chart.load(args.chart)
    try:
        out = chart.render(values, name=args.name, namespace=args.namespace, is_install=True)
    except helm_python.HelmError as e:
        print(f"helm_template: {args.chart}: {e}", file=sys.stderr)
        return 1
    for path in sorted(out):
        if path.endswith("NOTES.txt") or not out[path].strip():
            continue
        print(f"---\n# Source: {path}\n{out[path].strip()}")
    return 0


def merge(base: dict, over: dict) -> dict:
    """Values merged as Helm merges -f files: maps key by key, anything else replaced."""
    out = dict(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


if __name__ == "__main__":
    sys.exit(main())
