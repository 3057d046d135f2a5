"""Runs the allocator demo (and, when given, the checkpoint and pipeline examples) and validates
every dump they write against schemas/, with the dumps remat-report makes from them.

Also checks that the validator really rejects broken dumps, so a schema that accepts
anything cannot pass.
"""

import argparse
import copy
import json
import pathlib
import subprocess
import sys
import tempfile

import jsonschema


def load_schemas(schema_dir: pathlib.Path) -> dict:
    return {p.name: json.loads(p.read_text()) for p in schema_dir.glob("*.schema.json")}


def validator_for(schemas: dict, name: str):
    store = {}
    for file_name, schema in schemas.items():
        store[schema["$id"]] = schema
        store[file_name] = schema
    resolver = jsonschema.RefResolver(base_uri=schemas[name]["$id"], referrer=schemas[name], store=store)
    cls = jsonschema.validators.validator_for(schemas[name])
    cls.check_schema(schemas[name])
    return cls(schemas[name], resolver=resolver)


def errors_of(validator, doc) -> list:
    return [f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in validator.iter_errors(doc)]


def check_whatif(remat_report: str, validator, dumps: pathlib.Path) -> list:
    """whatif --json of the demo's peak snapshot (its trace ring, its recorded settings) under
    a second configuration: valid, the recorded settings first, and the recorded run's peak
    reserved no more than the snapshot's own peak (the ring may have dropped older events)."""
    run = subprocess.run([remat_report, "whatif", str(dumps / "snapshot-end.json"), "--json",
                          "--conf", "expandable_segments:True"], capture_output=True, text=True, check=False)
    if run.returncode != 0:
        return [f"whatif exited {run.returncode}: {run.stderr.strip()}"]
    doc = json.loads(run.stdout)
    failures = [f"whatif: {e}" for e in errors_of(validator, doc)]
    if [r["name"] for r in doc["runs"]] != ["recorded", "conf 1"] or "expandable_segments:True" not in doc["runs"][1]["conf"]:
        failures.append(f"whatif: runs are not the recorded settings then --conf: {[r['conf'] for r in doc['runs']]}")
    snapshot = json.loads((dumps / "snapshot-end.json").read_text())
    if doc["runs"][0]["peak_allocated"] > snapshot["stats"]["allocated_bytes"]["peak"]:
        failures.append("whatif: the replay allocated more at its peak than the recorded allocator ever did")
    broken = copy.deepcopy(doc)
    broken["runs"][0]["peak_reserved"] = -1
    if not errors_of(validator, broken):
        failures.append("whatif schema accepted a negative peak_reserved")
    return failures


def remat_report_verdict(remat_report: str, path: pathlib.Path) -> int:
    return subprocess.run([remat_report, "validate", str(path)], capture_output=True, text=True, check=False).returncode


def check_prediction_dumps(pipeline_train: str, remat_report, schemas: dict, dumps: pathlib.Path) -> tuple:
    """remat-pipeline-train --profile-stages writes stage-profile dumps (remat::pipeline::profile_stage);
    remat-report predict --json turns them into a pipeline-prediction, and ranks --predicted --json
    sets the allocator demo's snapshot beside it (a prediction-check). Each against its schema, by
    python-jsonschema and by remat-report validate, and a broken copy of each refused by both."""
    failures = []
    checked = 0
    profiles_dir = dumps / "profiles"
    subprocess.run([pipeline_train, "--profile-stages", "2", "--checkpoint", "--out", str(profiles_dir)], check=True,
                   stdout=subprocess.DEVNULL)
    profiles = sorted(profiles_dir.glob("stage-profile-stage*.json"))
    if len(profiles) != 2:
        return [f"--profile-stages 2 wrote {[p.name for p in profiles]}, not two stage profiles"], 0
    documents = [(p, "stage-profile") for p in profiles]
    if remat_report:
        predicted = subprocess.run([remat_report, "predict", *map(str, profiles), "--schedule", "1f1b", "--ranks", "2",
                                    "--microbatches", "4", "--buffers", "pooled", "--json"],
                                   capture_output=True, text=True, check=False)
        if predicted.returncode != 0:
            return [f"predict exited {predicted.returncode}: {predicted.stderr.strip()}"], 0
        prediction = dumps / "prediction.json"
        prediction.write_text(predicted.stdout)
        documents.append((prediction, "pipeline-prediction"))
        check = subprocess.run([remat_report, "ranks", str(dumps / "snapshot-peak.json"), "--predicted",
                                str(prediction), "--json"], capture_output=True, text=True, check=False)
        if check.returncode != 0:
            return [f"ranks --predicted exited {check.returncode}: {check.stderr.strip()}"], 0
        (dumps / "prediction-check.json").write_text(check.stdout)
        documents.append((dumps / "prediction-check.json", "prediction-check"))
    breakages = {"stage-profile": lambda d: d["bytes"].update(activation_bytes=1),  # a figure no schema names
                 "pipeline-prediction": lambda d: d["per_rank"][0].update(peak_bytes=-1),
                 "prediction-check": lambda d: d["ranks"][0].update(error="5%")}
    for path, kind in documents:
        validator = validator_for(schemas, f"{kind}.schema.json")
        doc = json.loads(path.read_text())
        failures += [f"{path.name}: {e}" for e in errors_of(validator, doc)]
        checked += 1
        if doc.get("kind") != kind:
            failures.append(f"{path.name}: kind {doc.get('kind')!r}, expected {kind!r}")
        if remat_report and remat_report_verdict(remat_report, path) != 0:
            failures.append(f"{path.name}: remat-report validate refused a {kind} dump the producer wrote")
        broken = copy.deepcopy(doc)
        breakages[kind](broken)
        if not errors_of(validator, broken):
            failures.append(f"{kind} schema accepted a broken {path.name}")
        if remat_report:
            broken_path = path.with_name(f"broken-{path.name}")
            broken_path.write_text(json.dumps(broken))
            if remat_report_verdict(remat_report, broken_path) != 2:
                failures.append(f"remat-report validate did not refuse (exit 2) a broken {path.name}")
    return failures, checked


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--schema-dir", required=True, type=pathlib.Path)
    parser.add_argument("--demo", required=True)
    parser.add_argument("--train-demo", help="remat-train-demo, whose remat-trace and memory-report dumps are checked")
    parser.add_argument("--remat-report", help="remat-report, whose whatif dump of the demo's trace is checked")
    parser.add_argument("--pipeline-train", help="remat-pipeline-train, whose stage profiles (and, with "
                        "--remat-report, the prediction from them and its check) are checked")
    args = parser.parse_args()
    schemas = load_schemas(args.schema_dir)
    snapshot = validator_for(schemas, "snapshot.schema.json")
    trace_header = validator_for(schemas, "trace.schema.json")
    event = validator_for({"event": {**schemas["snapshot.schema.json"]["$defs"]["event"],
                                     "$id": "https://schemas.remat.invalid/event", "$schema": schemas["snapshot.schema.json"]["$schema"]}},
                          "event")
    failures = []
    checked = 0
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([args.demo, "--out", tmp, "--layers", "2", "--steps", "2", "--force-oom"], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        oom_files = sorted(pathlib.Path(tmp).glob("oom-*.json"))
        if len(oom_files) != 1:
            failures.append(f"expected one OOM report from --force-oom, found {len(oom_files)}")
        for oom_file in oom_files:
            doc = json.loads(oom_file.read_text())
            failures += [f"{oom_file.name}: {e}" for e in errors_of(validator_for(schemas, "oom.schema.json"), doc)]
            checked += 1
        for name in ("snapshot-peak.json", "snapshot-end.json"):
            doc = json.loads(pathlib.Path(tmp, name).read_text())
            failures += [f"{name}: {e}" for e in errors_of(snapshot, doc)]
            checked += 1
            broken = copy.deepcopy(doc)
            broken["segments"][0]["blocks"][0]["state"] = "half-freed"
            del broken["stats"]["allocated_bytes"]
            if len(errors_of(snapshot, broken)) != 2:
                failures.append(f"{name}: the schema did not reject a bad block state and a missing stat")
        lines = pathlib.Path(tmp, "trace.jsonl").read_text().splitlines()
        header = json.loads(lines[0])
        failures += [f"trace.jsonl header: {e}" for e in errors_of(trace_header, header)]
        if header["event_count"] != len(lines) - 1:
            failures.append(f"trace.jsonl: event_count {header['event_count']} but {len(lines) - 1} event lines")
        for number, line in enumerate(lines[1:], start=2):
            failures += [f"trace.jsonl line {number}: {e}" for e in errors_of(event, json.loads(line))]
        checked += len(lines)
        if args.remat_report:
            failures += check_whatif(args.remat_report, validator_for(schemas, "whatif.schema.json"), pathlib.Path(tmp))
            checked += 1
        if args.pipeline_train:
            found, count = check_prediction_dumps(args.pipeline_train, args.remat_report, schemas, pathlib.Path(tmp))
            failures += found
            checked += count
        if args.train_demo:
            train_dir = pathlib.Path(tmp, "train")
            subprocess.run([args.train_demo, "--out", str(train_dir), "--steps", "2", "--layers", "2"], check=True,
                           stdout=subprocess.DEVNULL)
            for kind in ("remat-trace", "memory-report", "saved-report", "snapshot"):
                doc = json.loads((train_dir / f"{kind}.json").read_text())
                failures += [f"train {kind}.json: {e}" for e in errors_of(validator_for(schemas, f"{kind}.schema.json"), doc)]
                checked += 1
            broken = json.loads((train_dir / "remat-trace.json").read_text())
            broken["scopes"][0]["regions"][0]["decision"] = "maybe"
            if not errors_of(validator_for(schemas, "remat-trace.schema.json"), broken):
                failures.append("remat-trace schema accepted an unknown decision")
    for failure in failures:
        print(failure, file=sys.stderr)
    print(f"validated {checked} documents: {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
