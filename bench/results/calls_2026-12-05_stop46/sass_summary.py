#!/usr/bin/env python3
"""Summarises `ncu --import R --page source --csv --print-source sass` output (stop 46): per SASS instruction its
stall samples, execution count and top two stall reasons, then runs of consecutive instructions with the same
execution count (a loop body or a role's code) with their instruction mix and share of the samples.
usage: sass_summary.py FILE.csv [--min-instr N]"""
import csv, sys
from collections import Counter

rows = list(csv.reader(open(sys.argv[1])))
min_instr = int(sys.argv[sys.argv.index("--min-instr") + 1]) if "--min-instr" in sys.argv else 20000
hdr = rows[1]; data = rows[2:]
ix = {h: i for i, h in enumerate(hdr)}
stalls = [h for h in hdr if h.startswith("stall_")]
samples = lambda r: int(r[ix["Warp Stall Sampling (All Samples)"]] or 0)
execs = lambda r: int(r[ix["Instructions Executed"]] or 0)
tot = sum(samples(r) for r in data)
print("total samples", tot, "warp instructions executed", sum(execs(r) for r in data))
groups = []
for r in data:
    s, e = samples(r), execs(r)
    if e == 0 and s == 0:
        continue
    op = r[ix["Source"]].split() or ["?"]
    op = op[1] if op[0].startswith("@") and len(op) > 1 else op[0]
    if groups and groups[-1]["e"] == e:
        g = groups[-1]; g["n"] += 1; g["s"] += s; g["end"] = r[ix["Address"]]; g["ops"].append(op)
    else:
        groups.append(dict(e=e, n=1, s=s, start=r[ix["Address"]], end=r[ix["Address"]], ops=[op]))
print("== runs of equal execution count")
for g in groups:
    if g["e"] * g["n"] < min_instr and g["s"] < 20:
        continue
    c = Counter(o.split(".")[0] for o in g["ops"])
    print("%s-%s exec=%8d n=%4d instr=%9d samples=%5d (%4.1f%%) %s" % (
        g["start"][-5:], g["end"][-5:], g["e"], g["n"], g["e"] * g["n"], g["s"], 100 * g["s"] / max(1, tot),
        " ".join("%s%d" % (k, v) for k, v in c.most_common(8))))
print("== instructions")
for r in data:
    s, e = samples(r), execs(r)
    if e == 0 and s == 0:
        continue
    st = sorted(((float(r[ix[h]] or 0), h[6:]) for h in stalls), reverse=True)[:2]
    print("%5s %6d %9d  %-60s %s" % (r[ix["Address"]][-5:], s, e, r[ix["Source"]][:60],
                                     " ".join("%s:%d" % (n, v) for v, n in st if v > 0)))
