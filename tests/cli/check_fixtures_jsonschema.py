#!/usr/bin/env python3
"""Cross-checks the committed fixtures with python-jsonschema, so remat-report's own
validator and a reference implementation agree on what is valid. Exits 77 without jsonschema.

usage: check_fixtures_jsonschema.py SCHEMA_DIR
"""
import json
import pathlib
import sys

try:
    import jsonschema
except ImportError:
    print("python3-jsonschema not installed; skipping")
    sys.exit(77)

HERE = pathlib.Path(__file__).resolve().parent


def main():
    schemas = {p.name: json.loads(p.read_text()) for p in pathlib.Path(sys.argv[1]).glob("*.schema.json")}
    store = {s["$id"]: s for s in schemas.values()}

    def validator(name, fragment=None):
        schema = schemas[name]
        resolver = jsonschema.RefResolver(schema["$id"], schema, store=store)
        target = schema if fragment is None else resolver.resolve(fragment)[1]
        return jsonschema.Draft202012Validator(target, resolver=resolver)

    snapshot = validator("snapshot.schema.json")
    for name in ("snapshot-peak.json", "snapshot-end.json", "torch-snapshot.json"):
        snapshot.validate(json.loads((HERE / "data" / name).read_text()))
    lines = (HERE / "data" / "trace.jsonl").read_text().splitlines()
    validator("trace.schema.json").validate(json.loads(lines[0]))
    event = validator("snapshot.schema.json", "#/$defs/event")
    for line in lines[1:]:
        event.validate(json.loads(line))
    # The pipeline and budget fixtures were written before kinds were kebab-case: their kinds have underscores.
    reports = {"oom.json": "oom", "remat-trace.json": "remat-trace", "memory-report.json": "memory-report",
               "saved-report.json": "saved-report", "pipeline-plan.json": "pipeline-plan",
               "stage-profile-0.json": "stage-profile", "stage-profile-1.json": "stage-profile",
               "stage-profile-1-remat-runtime.json": "stage-profile",
               "pipeline-prediction.json": "pipeline-prediction",
               "region-profile.json": "region-profile", "llama-region-profile.json": "region-profile",
               "remat-plan-underscored.json": "remat-plan"}
    reports.update({f"pipeline-train-stage-profile-{s}.json": "stage-profile" for s in range(4)})
    for name, kind in reports.items():
        validator(f"{kind}.schema.json").validate(json.loads((HERE / "data" / name).read_text()))
    print(f"ok: 3 snapshots, a trace of {len(lines) - 1} events and {len(reports)} reports")


if __name__ == "__main__":
    main()
