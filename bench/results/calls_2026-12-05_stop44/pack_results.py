#!/usr/bin/env python3
"""Packs a device call's extracted $OUT folder into one results JSON: every .jsonl file as records, every .log with
JSON lines (bench_cuda_moe) as records, and the text of summary files and test logs' result lines.
usage: pack_results.py DIR OUT.json --commit C --call NAME --command CMD"""
import argparse, json, os, re

ap = argparse.ArgumentParser()
ap.add_argument("dir"); ap.add_argument("out")
ap.add_argument("--commit", required=True); ap.add_argument("--call", required=True)
ap.add_argument("--command", required=True); ap.add_argument("--date", default="2026-12-05")
ap.add_argument("--gpu", default="NVIDIA H200 (sm_90a)"); ap.add_argument("--stdout", default=None)
a = ap.parse_args()
files = {}
for root, _, names in os.walk(a.dir):
    for n in sorted(names):
        p = os.path.join(root, n); rel = os.path.relpath(p, a.dir)
        if n.endswith((".tgz", ".txz")):
            continue
        text = open(p, errors="replace").read()
        try:  # a whole JSON file (bench/linear.py --out)
            files[rel] = {"json": json.loads(text)}
            continue
        except ValueError:
            pass
        recs = []
        for l in text.splitlines():
            if l.startswith("{"):
                try:
                    recs.append(json.loads(l))
                except ValueError:
                    pass
        if recs:
            files[rel] = {"records": recs}
        else:
            keep = [l for l in text.splitlines()
                    if re.search(r"^\[  (PASSED|FAILED)|^\[       OK|Failure|actual|SUMMARY|rc=|hopper model", l)]
            if keep:
                files[rel] = {"lines": keep[:400]}
out = {"date": a.date, "gpu": a.gpu, "commit": a.commit, "command": a.command, "call": a.call, "files": files}
if a.stdout:
    out["stdout"] = open(a.stdout).read().splitlines()
json.dump(out, open(a.out, "w"), indent=1)
print(a.out, len(files), "files")
