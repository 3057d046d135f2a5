#!/usr/bin/env python3
"""Checks timeline pictures structurally: the SVG parses, its stacked series add up to the
bucket totals, the highest total is the dump's peak (as `memory --json` reports it), it has
axes, a legend and a peak marker, and neither file reaches for the network.

usage: check_timeline.py REMAT_REPORT
"""
import json
import pathlib
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

HERE = pathlib.Path(__file__).resolve().parent
SVG = "{http://www.w3.org/2000/svg}"


def run(*args):
    return subprocess.run([sys.argv[1], *args], cwd=HERE, capture_output=True, text=True, check=True).stdout


def no_network(text, name):
    for url in re.findall(r"https?://[^\s\"'<>)]+", text):
        assert url == "http://www.w3.org/2000/svg", f"{name} refers to {url}"


def check_sums(series, totals, name):
    assert series, f"{name}: no series"
    for b, total in enumerate(totals):
        stacked = sum(values[b] for values in series)
        assert stacked == total, f"{name}: bucket {b} stacks to {stacked}, total is {total}"


def check_svg(dump, by, out):
    run("timeline", dump, "-o", str(out), "--by", by)
    text = out.read_text()
    no_network(text, out.name)
    root = ET.fromstring(text)
    totals = [int(v) for v in root.find(f".//{SVG}g[@id='totals']").get("data-values").split()]
    paths = root.findall(f".//{SVG}g[@id='series']/{SVG}path")
    series = [[int(v) for v in p.get("data-values").split()] for p in paths]
    check_sums(series, totals, out.name)
    peak = int(root.get("data-peak-bytes"))
    assert max(totals) == peak, f"{out.name}: highest bucket {max(totals)} is not the peak {peak}"
    memory = json.loads(run("memory", dump, "--by", by, "--json"))
    assert memory["memory_total"]["peak_bytes"] == peak, "timeline peak differs from memory's"
    assert root.find(f".//{SVG}g[@id='peak']") is not None, "no peak marker"
    legend = root.findall(f".//{SVG}g[@id='legend']/{SVG}text")
    assert len(legend) == len(paths) + 1, "legend does not list every series"
    assert len(root.findall(f".//{SVG}g[@id='y-axis']/{SVG}text")) >= 2, "no y-axis labels"
    assert len(root.findall(f".//{SVG}g[@id='x-axis']/{SVG}text")) >= 2, "no x-axis labels"
    return peak


def check_html(dump, by, out, peak):
    run("timeline", dump, "-o", str(out), "--by", by)
    text = out.read_text()
    no_network(text, out.name)
    assert "<script src" not in text and "<link" not in text, "external resources"
    data = json.loads(re.search(r'<script type="application/json" id="timeline-data">(.*?)</script>', text, re.S)
                      .group(1).replace("<\\/", "</"))
    check_sums([s["values"] for s in data["series"]], data["totals"], out.name)
    assert data["peak_bytes"] == peak and max(data["totals"]) == peak


def main():
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        for dump, by in (("data/trace.jsonl", "region"), ("data/snapshot-end.json", "phase"),
                         ("data/trace.jsonl", "slot"), ("data/torch-snapshot.json", "site")):
            stem = f"{pathlib.Path(dump).stem}-{by}"
            peak = check_svg(dump, by, tmp / f"{stem}.svg")
            check_html(dump, by, tmp / f"{stem}.html", peak)
            print(f"ok {dump} --by {by}: peak {peak}")


if __name__ == "__main__":
    main()
