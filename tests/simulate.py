"""Deterministic simulation of the checkpoint lifecycle: one command, reproducible.

    python tests/simulate.py [--seeds N] [--steps M] [--seed S] [--json] [--time-box SEC]
                             [--list-lag SEC] [--no-faults] [--pause-outside-writers]
                             [--ha embedded|zookeeper] [--zk-lag SEC] [--restores N]
                             [--grown] [--plant NAME] [--jobs N]
                             [--world checkpoint|spark] [--provider P] [--tolerate KINDS]
                             [--gc-race SHARE]

Runs seeds S, S+1, ... S+N-1 (default S=0), each for M scheduler steps (one storage
operation of one actor per step), then a quiet phase (heal, reconcile, gc) and the final
checks. On a violation it prints the failing seed, the violation and a minimal trace;
``--seed S --seeds 1`` replays that run exactly. Exit status 1 if any seed failed.

``--world spark`` runs the second world instead (`sim.spark`): a Structured Streaming
query as Spark writes its checkpoint location, beside statehold's Spark-location code;
``--provider`` pins its state store (hdfs, rocksdb, rocksdb-v2; by default the seed picks),
``--tolerate`` notes the named violation kinds without failing the seed, ``--gc-race``
makes that share of the people's operations the race gc's re-check is for (a gc judging
for minutes while a rollback and the query's rerun rewrite what it judged).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from itertools import repeat
from pathlib import Path
from typing import Any

# tests/ (for `sim`) and the repository's root (for `tests.support`), so the script runs
# from anywhere, as documented: ``python tests/simulate.py``
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from sim.spark import PLANTS as SPARK_PLANTS  # noqa: E402
from sim.spark import run_spark_seed  # noqa: E402
from sim.world import PLANTS, grown, run_seed  # noqa: E402


def _run_one(
    seed: int, steps: int, options: dict[str, Any], grown_options: bool
) -> tuple[dict[str, Any], list[str]]:
    """One seed in a worker process: its result and its minimal trace."""
    logging.getLogger("statehold").setLevel(logging.CRITICAL)
    result, world = _run(seed, steps, options, grown_options)
    return result, world.minimal_trace()


def _run(seed: int, steps: int, options: dict[str, Any], grown_options: bool) -> Any:
    if options.get("world") == "spark":
        spark = {k: options[k] for k in ("list_lag", "faults", "plant", "provider", "tolerate")}
        if options.get("gc_race"):
            spark["gc_race"] = options["gc_race"]
        if spark["plant"]:
            spark = {**SPARK_PLANTS[spark["plant"]][3], **spark}
        return run_spark_seed(seed, steps, **spark)
    options = {k: v for k, v in options.items()
               if k not in ("world", "provider", "tolerate", "gc_race")}
    return run_seed(seed, steps, **({**options, **grown(seed)} if grown_options else options))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0, help="first seed")
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    p.add_argument("--time-box", type=float, default=None, help="stop starting seeds after")
    p.add_argument("--list-lag", type=float, default=0.0,
                   help="hide keys written less than this many seconds ago from listings")
    p.add_argument("--no-faults", action="store_true")
    p.add_argument("--pause-outside-writers", action="store_true",
                   help="also pause gc and dispose (beyond the design's timing assumptions)")
    p.add_argument("--ha", choices=["embedded", "zookeeper"], default="embedded",
                   help="the HA store (zookeeper: the real store against a simulated ensemble)")
    p.add_argument("--zk-lag", type=float, default=0.0,
                   help="ZooKeeper followers run up to this many seconds behind the leader")
    p.add_argument("--restores", type=int, default=1, help="restores that may run at once")
    p.add_argument("--grown", action="store_true",
                   help="every new part: even seeds embedded HA, odd seeds ZooKeeper with "
                        "lagging followers and list lag; concurrent restores (overrides the "
                        "four options above)")
    p.add_argument("--plant", default="", choices=["", *sorted(PLANTS), *sorted(SPARK_PLANTS)],
                   help="switch on a planted bug (the simulation must find it)")
    p.add_argument("--world", choices=["checkpoint", "spark"], default="checkpoint",
                   help="statehold's job directories, or a Spark query's checkpoint location")
    p.add_argument("--provider", choices=["hdfs", "rocksdb", "rocksdb-v2"], default=None,
                   help="--world spark: the state store (default: the seed picks)")
    p.add_argument("--tolerate", default="",
                   help="--world spark: violation kinds (comma-separated) noted, not failed")
    p.add_argument("--gc-race", type=float, default=0.0,
                   help="--world spark: the share of the people's operations that are a gc "
                        "judging for minutes beside a rollback and the query's rerun")
    p.add_argument("--jobs", type=int, default=1,
                   help="run seeds in this many processes (results printed in seed order)")
    args = p.parse_args(argv)
    logging.getLogger("statehold").setLevel(logging.CRITICAL)  # the trace tells the story
    options = {
        "list_lag": args.list_lag,
        "faults": not args.no_faults,
        "pause_outside_writers": args.pause_outside_writers,
        "ha": args.ha,
        "zk_lag": args.zk_lag,
        "restores": args.restores,
        "plant": args.plant,
        "world": args.world,
        "provider": args.provider,
        "tolerate": frozenset(k for k in args.tolerate.split(",") if k),
        "gc_race": args.gc_race,
    }
    if (args.plant in SPARK_PLANTS) != (args.world == "spark") and args.plant:
        p.error(f"--plant {args.plant} belongs to the other --world")
    started = time.monotonic()
    results = []
    failed = []
    total_steps = 0
    seeds = range(args.seed, args.seed + args.seeds)
    pool = ProcessPoolExecutor(args.jobs) if args.jobs > 1 else None
    runs = (
        pool.map(_run_one, seeds, repeat(args.steps), repeat(options), repeat(args.grown),
                 chunksize=1)
        if pool is not None else None
    )
    for seed in seeds:
        if args.time_box is not None and time.monotonic() - started > args.time_box:
            break
        if runs is not None:
            result, lines = next(runs)
            world = None
        else:
            result, world = _run(seed, args.steps, options, args.grown)
            lines = world.minimal_trace()
        results.append(result)
        total_steps += result["steps"]
        if result["violations"]:
            failed.append(seed)
            if not args.json:
                v = result["violations"][0]
                print(f"seed {seed}: VIOLATION at step {v['step']}: {v['kind']}: {v['message']}")
                print("minimal trace:")
                for line in lines:
                    print("  " + line)
                print(f"replay: python tests/simulate.py --seed {seed} --seeds 1 "
                      f"--steps {args.steps}{_flags(args)}")
        elif not args.json:
            tolerated = (f", tolerated {result['tolerated']}"
                         if result.get("tolerated") else "")
            print(f"seed {seed}: ok, {result['steps']} steps, "
                  f"{result['sim_seconds']:.0f} simulated s, {result['events']}{tolerated}",
                  flush=True)
    if pool is not None:
        pool.shutdown(cancel_futures=True)
    elapsed = time.monotonic() - started
    summary = {
        "seeds": [r["seed"] for r in results],
        "steps": total_steps,
        "violations": sum(len(r["violations"]) for r in results),
        "failed_seeds": failed,
        "seconds": round(elapsed, 2),
        "steps_per_second": round(total_steps / elapsed, 1) if elapsed else None,
        "runs": results,
    }
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"{len(results)} seed(s), {total_steps} steps, {summary['violations']} violation(s), "
              f"{elapsed:.1f}s ({summary['steps_per_second']} steps/s)")
    return 1 if failed else 0


def _flags(args: argparse.Namespace) -> str:
    """The options of this run that a replay needs."""
    out = ""
    if args.world == "spark":
        out += " --world spark"
        if args.list_lag:
            out += f" --list-lag {args.list_lag}"
        if args.provider:
            out += f" --provider {args.provider}"
        if args.tolerate:
            out += f" --tolerate {args.tolerate}"
        if args.gc_race:
            out += f" --gc-race {args.gc_race}"
    elif args.grown:
        out += " --grown"
    else:
        for flag, value, default in (("--ha", args.ha, "embedded"), ("--zk-lag", args.zk_lag, 0.0),
                                     ("--list-lag", args.list_lag, 0.0),
                                     ("--restores", args.restores, 1)):
            if value != default:
                out += f" {flag} {value}"
    if args.no_faults:
        out += " --no-faults"
    if args.pause_outside_writers:
        out += " --pause-outside-writers"
    if args.plant:
        out += f" --plant {args.plant}"
    return out


if __name__ == "__main__":
    if os.environ.get("PYTHONHASHSEED") != "0":  # set iteration order: part of the replay
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable, *sys.argv])
    sys.exit(main())
