#!/usr/bin/env python3
"""How well `fsdpp plan --machine` predicts ms/step here: calibrate, predict, train, compare.

For each launch (1, 2 and 4 local ranks; the virtual cluster's 2 nodes x 1 and x 2 ranks at two shaped link
rates) it runs `fsdpp bench calibrate` once, as that launch and with no deck named (the GEMM grid and the embedded
tiny deck's kernels: every case is held out, no deck or shape of a case was used to calibrate), into a machine
file; then for each case `fsdpp plan ... --machine <file> --json` (predicted ms/step) and the real
`fsdpp train` (measured: the median ms/step of the steps after --warmup). Error = (predicted - measured) /
measured. The search check trains at least 8 layouts of one deck and global batch on the virtual cluster and
compares the measured ms/step of the layout the model ranks first with the best measured one (search_best_gap).

Prints a table, then one JSON line: median_abs_error, max_abs_error, cases, search_best_gap, search.
--ci: calibrate --quick and a few 1- and 2-rank cases of three decks (the ctest test model_accuracy_ci); a case over --bound (0.15)
is calibrated and measured once more (--retries); exits 1 when an error still exceeds the bound, 77 (skipped) when
a run got less than --min-share of its cores (another job's load is not this machine's speed).
"""
import argparse
import json
import os
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

SMALL, LLAMA, MID = "input/small.yaml", "input/llama-tiny.yaml", "input/llama-mid.yaml"
QWEN = "input/qwen2-tiny.yaml"


def batch(mb, dp, accum=1):
    return [f"train.micro_batch={mb}", f"train.global_batch={mb * dp * accum}"]


HSDP = ["fsdp.strategy=hybrid_shard", "mesh.dp_replicate=2", "mesh.dp_shard=2"]
AC = ["train.activation_checkpointing=full"]
TP2 = ["mesh.tp=2"]
PP2 = ["mesh.pp=2"]  # a pipeline: each stage priced, the schedule replayed (plan_pipeline_step)
INTERLEAVED = ["pipeline.schedule=interleaved_1f1b", "pipeline.virtual_stages=2"]
ZERO_BUBBLE = ["pipeline.schedule=zero_bubble"]  # the weight passes priced apart (StepRecorder's backward_weight)

# (label, deck, overrides) per launch; the label says deck / layout / micro-batch.
LOCAL = {
    1: [("small/1-rank/mb8", SMALL, batch(8, 1)),
        ("small/1-rank/mb4", SMALL, batch(4, 1)),
        ("small/1-rank/ac/mb8", SMALL, batch(8, 1) + AC),
        ("llama-tiny/1-rank/mb8", LLAMA, batch(8, 1)),
        ("llama-tiny/1-rank/mb16", LLAMA, batch(16, 1)),
        ("llama-mid/1-rank/mb1", MID, batch(1, 1)),
        ("llama-mid/1-rank/mb2", MID, batch(2, 1))],
    2: [("small/full_shard-2/mb8", SMALL, batch(8, 2)),
        ("small/full_shard-2/mb4", SMALL, batch(4, 2)),
        ("small/tp2/mb8", SMALL, batch(8, 1) + TP2),
        ("small/full_shard-2/ac/mb8", SMALL, batch(8, 2) + AC),
        ("llama-tiny/full_shard-2/mb8", LLAMA, batch(8, 2)),
        ("llama-tiny/tp2/mb8", LLAMA, batch(8, 1) + TP2),
        ("llama-mid/full_shard-2/mb1", MID, batch(1, 2)),
        ("small/pp2-1f1b/mb1x8", SMALL, batch(1, 1, 8) + PP2),
        ("small/pp2-interleaved/mb1x8", SMALL, batch(1, 1, 8) + PP2 + INTERLEAVED),
        ("small/pp2-zero_bubble/mb1x8", SMALL, batch(1, 1, 8) + PP2 + ZERO_BUBBLE)],
    4: [("small/full_shard-4/mb4", SMALL, batch(4, 4)),
        ("small/hsdp-2x2/mb4", SMALL, batch(4, 4) + HSDP),
        ("small/tp2-dp2/mb4", SMALL, batch(4, 2) + TP2),
        ("llama-tiny/hsdp-2x2/mb8", LLAMA, batch(8, 4) + HSDP)],
}
CLUSTER = {  # nodes x ranks per node
    (2, 1): [("small/full_shard-2/mb8", SMALL, batch(8, 2)),
             ("small/tp2/mb8", SMALL, batch(8, 1) + TP2),
             ("llama-tiny/full_shard-2/mb8", LLAMA, batch(8, 2))],
    (2, 2): [("small/hsdp-2x2/mb4", SMALL, batch(4, 4) + HSDP)],
}
# The search check: one deck, one global batch (16 sequences), 4 ranks on 2 nodes; layouts that fit.
SEARCH = [("full_shard-4/mb4", batch(4, 4)),
          ("full_shard-4/mb2x2", batch(2, 4, 2)),
          ("full_shard-4/no-reshard/mb4", batch(4, 4) + ["fsdp.reshard_after_forward=false"]),
          ("full_shard-4/ac/mb4", batch(4, 4) + AC),
          ("hsdp-2x2/mb4", batch(4, 4) + HSDP),
          ("hsdp-2x2/mb2x2", batch(2, 4, 2) + HSDP),
          ("hsdp-2x2/ac/mb4", batch(4, 4) + HSDP + AC),
          ("tp2-dp2/mb8", batch(8, 2) + TP2),
          ("tp2-dp2/mb4x2", batch(4, 2, 2) + TP2),
          ("no_shard-4/mb4", batch(4, 4) + ["fsdp.strategy=no_shard"])]
# CI: cases whose step is mostly compute (a step of many tiny collectives on 2 ranks sharing 2 busy cores is
# scheduler latency, not the machine the model describes).
# Held out: the calibration of each launch names no deck, so none of these decks or their GEMM shapes was measured.
CI = {1: [("small/1-rank/mb4", SMALL, batch(4, 1)), ("small/1-rank/mb2", SMALL, batch(2, 1)),
          ("llama-tiny/1-rank/mb16", LLAMA, batch(16, 1)), ("qwen2-tiny/1-rank/mb16", QWEN, batch(16, 1))],
      2: [("small/full_shard-2/mb4", SMALL, batch(4, 2)), ("small/tp2/mb4", SMALL, batch(4, 1) + TP2),
          ("llama-mid/full_shard-2/mb1", MID, batch(1, 2)), ("small/pp2-1f1b/mb1x8", SMALL, batch(1, 1, 8) + PP2)]}


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def run(cmd, out=None, env=None):
    log("  $ " + " ".join(shlex.quote(c) for c in cmd))
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    if r.returncode != 0:
        sys.stderr.write(r.stdout[-3000:] + r.stderr[-3000:])
        raise SystemExit(f"error: {cmd[0]} ... failed (exit {r.returncode}): " + " ".join(cmd))
    if out:
        with open(out, "w") as f:
            f.write(r.stdout)
    return r.stdout


class Bench:
    def __init__(self, a):
        self.a, self.fsdpp = a, os.path.realpath(a.fsdpp)
        self.work = tempfile.mkdtemp(prefix="fsdpp-model-accuracy-")
        self.rows = []

    def calibrate(self, name, launch):
        """One machine file for every deck of the launch: no deck named, so the cases are held out."""
        machine = os.path.join(self.work, f"machine-{name}.yaml")
        cmd = launch + [self.fsdpp, "bench", "calibrate", "--name", f"here-{name}"]
        run(cmd + (["--quick"] if self.a.quick else []), out=machine)
        return machine

    def predict(self, deck, overrides, ranks, machine):
        out = run([self.fsdpp, "plan", deck, *overrides, "--ranks", str(ranks), "--machine", machine, "--json"])
        return json.loads(out.strip().splitlines()[-1])["time"]["ms_per_step"]

    def measure(self, label, launch, deck, overrides, ranks, steps=None):
        """Median ms/step after the warm-up, and the CPU share the run got: its processes' CPU seconds over the
        wall seconds of the cores it could use (about 1 on a quiet machine; None where the ranks are not this
        process's children, srun)."""
        out = os.path.join(self.work, "run-" + label.replace("/", "-"))
        ms, cpu, wall = [], 0.0, 0.0
        fixed = steps is not None
        steps = steps or self.a.steps
        for r in range(self.a.rounds):
            o = f"{out}-{r}"
            before, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
            run(launch + [self.fsdpp, "train", deck, *overrides, f"train.steps={steps}", "train.eval_interval=0",
                          "schedule.warmup_steps=1", "log.interval=1", "checkpoint.interval=0", f"run.output={o}"])
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            wall += time.monotonic() - t0
            cpu += after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
            rows = [json.loads(line) for line in open(os.path.join(o, "metrics.jsonl"))]
            timed = [x["ms_per_step"] for x in rows if "ms_per_step" in x][self.a.warmup:]
            # Steps of a few ms are at the mercy of the scheduler: time enough of them to cover --min-timed-s
            # (the first round tells how many), and keep only those.
            if not fixed and r == 0 and sum(timed) / 1e3 < self.a.min_timed_s:
                steps = self.a.warmup + int(self.a.min_timed_s * 1e3 / max(statistics.median(timed), 1e-3)) + 1
                log(f"  steps of {statistics.median(timed):.1f} ms: timing {steps - self.a.warmup} of them")
                return self.measure(label, launch, deck, overrides, ranks, steps)
            ms += timed
        share = cpu / (wall * min(ranks, os.cpu_count() or 1)) if launch[0] != "srun" else None
        return statistics.median(ms), share

    def case(self, where, label, launch, ranks, deck, overrides, machine):
        predicted = self.predict(deck, overrides, ranks, machine)
        measured, share = self.measure(f"{where}/{label}", launch, deck, overrides, ranks)
        row = {"case": f"{where}/{label}", "ranks": ranks, "predicted_ms": round(predicted, 2),
               "measured_ms": round(measured, 2), "error": round((predicted - measured) / measured, 4),
               "cpu_share": None if share is None else round(share, 3),
               "load_average": round(os.getloadavg()[0], 2)}  # the machine's, over the last minute of the run
        log(f"  {row['case']}: predicted {predicted:.1f} ms, measured {measured:.1f} ms, error {row['error']:+.1%}, "
            f"CPU share {share if share is None else round(share, 2)}")
        self.rows.append(row)
        return row

    def local(self, table):
        for ranks, cases in table.items():
            cases = [c for c in cases if self.a.only in f"local-{ranks}/{c[0]}"]
            if ranks not in self.a.ranks or not cases:
                continue
            launch = [self.a.mpiexec, "-n", str(ranks)]
            log(f"local, {ranks} rank(s): calibrating")
            machine = self.calibrate(f"local-{ranks}", launch)
            for label, deck, ov in cases:
                row = self.case(f"local-{ranks}", label, launch, ranks, deck, ov, machine)
                self.retry(row, f"local-{ranks}", label, launch, ranks, deck, ov)

    def retry(self, row, where, label, launch, ranks, deck, overrides):
        """A case over --bound is calibrated and measured afresh, up to --retries times; the last attempt is the
        case's result, the earlier errors stay in its row. This machine's speed moves by up to 10% between runs
        minutes apart (docs/performance-model.md): one slow or fast minute under the calibration or the run is
        not the model's error, while a model that is off fails every attempt."""
        earlier = []
        for attempt in range(self.a.retries):
            if abs(row["error"]) <= self.a.bound:
                break
            log(f"  {row['case']}: {row['error']:+.1%} is over the bound {self.a.bound:.0%}; calibrating and "
                f"measuring again (attempt {attempt + 2} of {self.a.retries + 1})")
            earlier.append(row["error"])
            at = self.rows.index(row)
            machine = self.calibrate(f"{where}-retry{attempt + 1}", launch)
            row = self.case(where, label, launch, ranks, deck, overrides, machine)
            self.rows[at] = self.rows.pop()  # the new attempt takes the old one's place in the table
        if earlier:
            row["earlier_errors"] = earlier


def cluster(b, vcluster):
    """The virtual cluster's cases at each rate, and the search check at the first. Returns the search result."""
    os.environ.setdefault("FSDPP_VCLUSTER_DIR", os.path.join(b.work, "vcluster"))
    pin = ["--pin"] if b.a.pin_nodes else []
    env_up = subprocess.run([vcluster, "up", "--nodes", "2", "--cpus", "2"] + pin, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    if env_up.returncode != 0:
        return {"skipped": (env_up.stderr.strip().splitlines() or ["vcluster up failed"])[-1]}
    search = {} if b.a.search_rounds > 0 else {"skipped": "--search-rounds 0"}
    try:
        for line in env_up.stdout.splitlines():  # export SLURM_CONF=...
            if line.startswith("export ") and "=" in line:
                k, v = line[len("export "):].split("=", 1)
                os.environ[k] = v.strip("'\"")
        os.environ["FSDPP_DEVICE"] = "host"
        for i, rate in enumerate(b.a.rates):
            run([vcluster, "shape", rate])
            for (nodes, per), cases in CLUSTER.items():
                launch = ["srun", "--mpi=pmix", f"--nodes={nodes}", f"--ntasks-per-node={per}", "--cpus-per-task=1",
                          "--partition=vc"]
                where = f"vc-{nodes}x{per}-{rate}"
                search_cases = ([(l, SMALL, ov) for l, ov in SEARCH]
                                if i == 0 and (nodes, per) == (2, 2) and b.a.search_rounds > 0 else [])
                cases = [c for c in cases if b.a.only in f"{where}/{c[0]}"]
                search_cases = search_cases if b.a.only in f"{where}/search" else []
                if not cases and not search_cases:
                    continue
                log(f"{where}: calibrating")
                machine = b.calibrate(where, launch)
                for label, deck, ov in cases:
                    b.case(where, label, launch, nodes * per, deck, ov, machine)
                if search_cases:
                    search = search_check(b, where, launch, nodes * per, machine)
    finally:
        subprocess.run([vcluster, "down"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return search


def search_check(b, where, launch, ranks, machine):
    """Each layout is measured in --search-rounds passes over all of them (interleaved, so that a slow or fast
    minute of the machine falls on several layouts, not on all runs of one); its figure is the median over the
    passes (two: their mean)."""
    predicted = {label: b.predict(SMALL, ov, ranks, machine) for label, ov in SEARCH}
    runs = {label: [] for label, _ in SEARCH}
    for r in range(b.a.search_rounds):
        for label, ov in SEARCH:
            measured, _ = b.measure(f"{where}/search/{label}/pass{r + 1}", launch, SMALL, ov, ranks)
            runs[label].append(measured)
            log(f"  search {label} (pass {r + 1}): predicted {predicted[label]:.1f} ms, measured {measured:.1f} ms")
    layouts = [{"layout": label, "predicted_ms": round(predicted[label], 2),
                "measured_ms": round(statistics.median(runs[label]), 2),
                "measured_passes_ms": [round(x, 2) for x in runs[label]]} for label, _ in SEARCH]
    picked = min(layouts, key=lambda x: x["predicted_ms"])
    best = min(layouts, key=lambda x: x["measured_ms"])
    return {"where": where, "deck": SMALL, "global_batch": 16, "layouts": layouts, "predicted_best": picked["layout"],
            "measured_best": best["layout"], "gap": round(picked["measured_ms"] / best["measured_ms"] - 1, 4)}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fsdpp", default="build/bin/fsdpp")
    p.add_argument("--mpiexec", default="mpiexec")
    p.add_argument("--steps", type=int, default=8, help="training steps per run")
    p.add_argument("--warmup", type=int, default=2, help="first steps of each run not timed")
    p.add_argument("--rounds", type=int, default=1, help="runs per case; the median is over all their steps")
    p.add_argument("--min-timed-s", type=float, default=2.0, help="a case whose timed steps last less runs again "
                                                                  "with enough steps to fill this many seconds")
    p.add_argument("--search-rounds", type=int, default=2, help="passes over the search check's layouts; each "
                                                                 "layout's figure is the median over them (0: no search check)")
    p.add_argument("--pin-nodes", action="store_true", help="each virtual-cluster node on cores of its own "
                                                             "(vcluster up --pin), as real nodes are")
    p.add_argument("--only", default="", help="run only the cases whose label contains this text")
    p.add_argument("--ranks", default="1,2,4", help="local launches to run (none: only the virtual cluster)")
    p.add_argument("--nodes", default="auto", choices=["auto", "off"], help="the virtual-cluster cases")
    p.add_argument("--rates", default="1000mbit,300mbit", help="the two shaped link rates of the virtual cluster")
    p.add_argument("--quick", action="store_true", help="calibrate --quick")
    p.add_argument("--keep-work", action="store_true", help="keep the work folder (machine files, runs) and say where")
    p.add_argument("--ci", action="store_true", help="the CI subset (1 and 2 ranks, calibrate --quick); exit 1 "
                                                     "when an error exceeds --bound")
    p.add_argument("--bound", type=float, default=0.15)
    p.add_argument("--retries", type=int, default=None, help="a local case over --bound is calibrated and measured "
                                                              "again up to this many times (default: 1 with --ci, "
                                                              "else 0)")
    p.add_argument("--min-share", type=float, default=0.8, help="--ci: below this CPU share of a run the machine "
                                                                 "was busy, and the test is skipped (exit 77)")
    a = p.parse_args()
    a.ranks = [int(x) for x in a.ranks.split(",") if x not in ("", "none")]
    a.rates = a.rates.split(",")
    if a.steps <= a.warmup:
        raise SystemExit("error: --steps must exceed --warmup (the warm-up steps are not timed)")
    if a.ci:
        a.quick, a.nodes = True, "off"
    if a.retries is None:
        a.retries = 1 if a.ci else 0
    b = Bench(a)
    b.local(CI if a.ci else LOCAL)
    search = {"skipped": "--nodes off"}
    if a.nodes == "auto":
        search = cluster(b, os.path.join(os.path.dirname(__file__), "..", "cluster", "vcluster"))
    errors = [abs(r["error"]) for r in b.rows]
    print(f"{'case':<46} {'predicted ms':>13} {'measured ms':>12} {'error':>8} {'CPU share':>10} {'load':>6}")
    for r in b.rows:
        share = "-" if r["cpu_share"] is None else f"{r['cpu_share']:.2f}"
        print(f"{r['case']:<46} {r['predicted_ms']:>13.1f} {r['measured_ms']:>12.1f} {r['error']:>+8.1%} {share:>10} "
              f"{r['load_average']:>6.1f}" + "".join(f"   (an earlier attempt: {e:+.1%})" for e in r.get("earlier_errors", [])))
    print(f"CPU share: the run's CPU seconds over the wall seconds of the cores it could use (- under srun); well "
          f"below 1, other work on the machine took the rest and the measured ms/step is not this machine's speed. "
          f"load: the 1-minute load average after the run ({os.cpu_count()} cores).")
    if "layouts" in search:
        print(f"\nsearch check ({search['where']}, {search['deck']}, global batch {search['global_batch']}):")
        for x in search["layouts"]:
            print(f"  {x['layout']:<32} predicted {x['predicted_ms']:>9.1f} ms   measured {x['measured_ms']:>9.1f} ms"
                  f"   (passes: {', '.join(f'{m:.1f}' for m in x['measured_passes_ms'])})")
        print(f"  predicted best {search['predicted_best']}, measured best {search['measured_best']}: "
              f"gap {search['gap']:.1%}")
    else:
        print(f"\nsearch check not run: {search.get('skipped')}")
    result = {"bench": "model_accuracy",
              "median_abs_error": round(statistics.median(errors), 4) if errors else None,
              "max_abs_error": round(max(errors), 4) if errors else None, "cases": b.rows,
              "search_best_gap": search.get("gap"), "search": search,
              "min_cpu_share": min((r["cpu_share"] for r in b.rows if r["cpu_share"] is not None), default=None),
              "steps": a.steps, "warmup": a.warmup, "rounds": a.rounds, "quick_calibration": a.quick}
    print(json.dumps(result))
    if a.keep_work:
        log(f"kept the work folder: {b.work}")
    else:
        shutil.rmtree(b.work, ignore_errors=True)
    busy = [r for r in b.rows if r["cpu_share"] is not None and r["cpu_share"] < a.min_share]
    if a.ci and busy:  # not this machine's speed: the bound cannot be checked, which is not a pass either
        log(f"SKIPPED: the machine was busy: {busy[0]['case']} got a CPU share of {busy[0]['cpu_share']:.2f} "
            f"(< --min-share {a.min_share}); run it again on a quiet machine")
        return 77
    if a.ci and (not errors or max(errors) > a.bound):
        log(f"error: a prediction is off by {max(errors):.1%}, more than the bound {a.bound:.0%}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
