#!/usr/bin/env python3
"""Checks a run.trace folder (lib/fsdpp/observe/timeline.hpp) and `fsdpp report --trace --json`'s output.

Usage: trace_check.py <run folder> <world size> <report.json> [expected mesh dimension ...] [--span NAME ...]
  - every rank<r>.json parses, is an fsdpp trace of rank r in a job of <world size>, and covers the traced steps;
  - per track, the complete events are sorted by start and properly nested (a stack of enclosing spans);
  - per communicator, its events == issued_end - issued_begin == otherData.comms[].events, and the FSDP and
    tensor-parallel counters of otherData equal the collectives on the tracks with their sites;
  - every wait / blocking span starts after its collective's issue, is no longer than issue -> completion and
    ends by the completion (one begun after it is empty);
  - merged.json holds every rank as a pid; the report names the units and the expected mesh dimensions.
"""
import collections
import json
import sys


EXTRA_SPANS = []  # --span NAME: compute spans this run must have too


def ns(us):
    return round(us * 1000)


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def check_nesting(where, events):
    by_track = collections.defaultdict(list)
    for e in events:
        if e["ph"] == "X":
            by_track[(e["pid"], e["tid"])].append(e)
    for track, evs in by_track.items():
        stack = []  # ends of enclosing spans
        last = None
        for e in evs:
            start, end = ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])
            key = (start, -(end - start))
            if last is not None and key < last:
                fail(f"{where}: track {track}: '{e['name']}' at {e['ts']} us is out of order")
            last = key
            while stack and stack[-1] <= start and not (stack[-1] == start and end == start):
                stack.pop()
            if stack and end > stack[-1]:
                fail(f"{where}: track {track}: '{e['name']}' [{e['ts']}, +{e['dur']}] us overlaps the span holding it "
                     f"without nesting in it (that one ends at {stack[-1] / 1000} us)")
            stack.append(end)
    return by_track


def check_rank(folder, rank, world):
    path = f"{folder}/trace/rank{rank}.json"
    with open(path) as f:
        t = json.load(f)
    other = t["otherData"]
    if other.get("format") != "fsdpp-trace 1" or other["rank"] != rank or other["world"] != world:
        fail(f"{path}: otherData {other.get('format')}, rank {other['rank']}, world {other['world']}")
    events = t["traceEvents"]
    check_nesting(path, events)
    complete = [e for e in events if e["ph"] == "X"]
    compute = [e for e in complete if e["tid"] == 0]
    names = {e["name"] for e in compute}
    for needed in ("fsdpp::optimizer", "fsdpp::data", "fsdpp::grad_sync", *EXTRA_SPANS):
        if needed not in names:
            fail(f"{path}: no compute span '{needed}'")
    # every rank runs units forward and backward; rank 0 holds h.0 (a later pipeline stage holds later blocks)
    for pass_ in ("forward", "backward"):
        if not any(n.startswith(f"fsdpp::{pass_} ") for n in names) or (rank == 0 and f"fsdpp::{pass_} h.0" not in names):
            fail(f"{path}: no compute span 'fsdpp::{pass_} <unit>' (rank 0: h.0)")
    collectives = {}
    per_tid = collections.Counter()
    for e in complete:
        if e["tid"] == 0:
            continue
        a = e["args"]
        per_tid[e["tid"]] += 1
        collectives[(e["tid"] - 1, a["seq"])] = e
    for c in other["comms"]:
        n = c["issued_end"] - c["issued_begin"]
        if not (per_tid[c["tid"]] == n == c["events"]):
            fail(f"{path}: communicator {c['label']}: {per_tid[c['tid']]} events on its track, {n} issued, "
                 f"otherData says {c['events']}")
    # The counters against the sites of the collectives (FSDP: "<unit> forward|backward all-gather",
    # "<unit> gradient reduction"; tensor parallelism: "<unit> forward|backward (tensor parallel)").
    # FsdpStats counts a unit's gradient all-reduce once, though no_shard issues one per parameter: a run of
    # consecutive all-reduces with one site on one communicator is one.
    seen = collections.Counter()
    previous = {}  # tid -> (seq, site) of the last gradient all-reduce
    for (comm, seq), e in sorted(collectives.items()):
        a = e["args"]
        site, op = a["site"], a["op"]
        if site.endswith(" all-gather") and op == "all_gather":
            seen["fsdp_all_gathers"] += 1
        elif site.endswith(" gradient reduction") and op == "reduce_scatter":
            seen["fsdp_reduce_scatters"] += 1
        elif site.endswith(" gradient reduction"):
            if previous.get(comm) != (seq - 1, site):
                seen["fsdp_all_reduces"] += 1
            previous[comm] = (seq, site)
        elif site.endswith("(tensor parallel)"):
            seen["tp_" + op + "s"] += 1
    counters = other["counters"]
    for k, v in counters.items():
        if seen[k] != v:
            fail(f"{path}: counter {k} = {v}, but {seen[k]} such collectives on the communicator tracks")
    if sum(v for k, v in counters.items() if k.startswith("fsdp_")) == 0:
        fail(f"{path}: no FSDP collectives counted: {counters}")
    waits = 0
    for e in compute:
        if e["cat"] not in ("wait", "blocking"):
            continue
        waits += 1
        a = e["args"]
        c = collectives.get((a["comm_id"], a["seq"]))
        if c is None:
            fail(f"{path}: '{e['name']}' waits for collective {a['seq']} of communicator {a['comm']}, not on its track")
        issued, completed = ns(c["args"]["issued_us"]), ns(c["ts"]) + ns(c["dur"])
        start, end = ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])
        # A wait begun after the collective completed is empty; any other ends by the completion.
        if start < issued - 1 or end - start > completed - issued + 1 or (end > completed + 1 and end > start):
            fail(f"{path}: '{e['name']}' [{start}, {end}] ns is longer than or outside its collective's issue -> "
                 f"completion [{issued}, {completed}] ns")
    if waits == 0:
        fail(f"{path}: no wait or blocking spans")
    return other, len(complete), waits


def main():
    args = sys.argv[1:]
    while "--span" in args:
        at = args.index("--span")
        EXTRA_SPANS.append(args[at + 1])
        del args[at:at + 2]
    folder, world, report = args[0], int(args[1]), args[2]
    dims = args[3:]
    units = None
    for rank in range(world):
        other, n, waits = check_rank(folder, rank, world)
        units = units or other["units"]
        print(f"rank {rank}: {n} events ({waits} waits), counters {other['counters']}")
    with open(f"{folder}/trace/merged.json") as f:
        merged = json.load(f)
    pids = {e["pid"] for e in merged["traceEvents"]}
    if pids != set(range(world)):
        fail(f"merged.json: pids {sorted(pids)}, expected 0..{world - 1}")
    check_nesting("merged.json", merged["traceEvents"])
    with open(report) as f:
        r = json.load(f)
    names = [u["unit"] for u in r["units"]]
    for u in units:
        if u not in names:
            fail(f"report: unit {u} missing from {names}")
    got = [d["mesh dimension"] for d in r["by_dim"]]
    for d in dims:
        if d not in got:
            fail(f"report: mesh dimension {d} missing from {got}")
    if not (r["total"]["collectives"] > 0 and 0 <= r["total"]["exposed_pct"] <= 100.0001):
        fail(f"report: implausible total {r['total']}")
    print(f"trace OK: {world} ranks, units {names}, mesh dimensions {got}, "
          f"{r['total']['exposed_pct']:.1f}% of the collectives' time exposed")


main()
