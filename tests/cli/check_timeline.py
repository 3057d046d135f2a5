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


def check_hostile_names(tmp):
    """Names that try to break out of the markup or reach a terminal stay text in both files."""
    hostile = ['</script><script>alert(1)</script>', '"><svg onload=alert(2)>\x1b[31m', "it's & <b>bold</b>\x9b2J\x7f"]
    header = json.loads((HERE / "data" / "trace.jsonl").read_text().splitlines()[0])
    header.update(names=["", *hostile], event_count=None,
                  tags=[{"region": i, "policy": "none", "phase": "other", "site": 0, "recv": None} for i in range(4)])
    lines = [json.dumps(header)] + [json.dumps({"action": "alloc", "time_us": i, "address": 4096 * (i + 1),
                                                "size": 1000 * (i + 1), "stream": 0, "tag": i}) for i in range(4)]
    dump = tmp / "hostile.jsonl"
    dump.write_text("\n".join(lines) + "\n")
    svg_path, html_path = tmp / "hostile.svg", tmp / "hostile.html"
    run("timeline", str(dump), "-o", str(svg_path))
    run("timeline", str(dump), "-o", str(html_path))
    svg = svg_path.read_text()
    root = ET.fromstring(svg)  # well-formed despite the names
    assert "<script" not in svg and "onload" not in [a for e in root.iter() for a in e.attrib], "markup from a name"
    labels = sorted(p.get("data-label") for p in root.findall(f".//{SVG}g[@id='series']/{SVG}path"))
    # XML cannot hold C0 controls: the SVG shows them as spaces.
    expected = sorted(name.replace("\x1b", " ") for name in ["(untagged)", *hostile])
    assert labels == expected, f"SVG labels {labels} != {expected}"
    assert not any(ch in svg for ch in "\x1b\x07"), "a control character in the SVG"

    html = html_path.read_text()
    assert html.count("<script") == 2 and html.count("</script>") == 2, "a name opened or closed a script element"
    data = json.loads(re.search(r'<script type="application/json" id="timeline-data">(.*?)</script>', html, re.S)
                      .group(1).replace("<\\/", "</"))
    names = sorted(s["label"] for s in data["series"] if not s["placeholder"])
    # A name wrapped in <...> reads like one of remat-report's own labels and is shown quoted.
    shown = sorted(['"' + hostile[0] + '"', *hostile[1:]])
    assert names == shown, f"HTML data labels {names} != {shown}"
    assert "\x1b" not in html and "\x9b" not in html, "a control character in the HTML"
    for name in hostile:
        assert name not in html.replace("<\\/", "</").split('id="timeline-data">')[0], "a raw name in the markup"
    print("ok hostile names stay text in SVG and HTML")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        check_hostile_names(tmp)
        for dump, by in (("data/trace.jsonl", "region"), ("data/snapshot-end.json", "phase"),
                         ("data/trace.jsonl", "slot"), ("data/torch-snapshot.json", "site")):
            stem = f"{pathlib.Path(dump).stem}-{by}"
            peak = check_svg(dump, by, tmp / f"{stem}.svg")
            check_html(dump, by, tmp / f"{stem}.html", peak)
            print(f"ok {dump} --by {by}: peak {peak}")


if __name__ == "__main__":
    main()
