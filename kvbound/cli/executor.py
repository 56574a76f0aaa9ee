"""`kvbound profile`, `kvbound calibrate`, `kvbound replay` (docs/executor.md).

torch is imported inside the commands only: the rest of kvbound works without the `executor`
extra, and these commands say how to install it when it is missing.
"""
from __future__ import annotations

import argparse
import json
import os
from collections import Counter
from pathlib import Path

import numpy as np

from ..engine_bridge.config import SHAPES
from ..errors import InputError, KvboundError
from ..fileio import write_user_file
from ..io.cases import load_case, load_cost_file
from ..io.schedules import load_schedule
from ..schedule import ScheduleError, validate
from .args import MAX_INT, number, positive, seed

#: where `calibrate` looks for GPU operator profiles unless --profiling names a folder
PROFILING_ENV = "KVBOUND_PROFILING"
#: without the variable: the reference data beside the repository (../shared/data, see its README.md)
REPO_PROFILING = Path(__file__).resolve().parents[3] / "shared" / "data" / "profiling"  # kvbound/cli/executor.py
_OPERATOR_LAYERS = 32  # Llama-2-7B and Llama-3-8B both have 32 layers


def default_profiling() -> Path:
    return Path(os.environ.get(PROFILING_ENV) or REPO_PROFILING)


def register(sub) -> None:
    p = sub.add_parser("profile", help="time a grid of batch compositions on the executor (CSV for calibrate)")
    _executor_options(p, shape_required=True)
    p.add_argument("--out", required=True, help="the profile CSV to write")
    p.add_argument("--points", type=positive(int), help="time only this many compositions of the grid (a seeded "
                                                       "random subset)")
    p.set_defaults(func=cmd_profile)

    p = sub.add_parser("calibrate", help="fit the cost model to a profile (non-negative least squares, token knees by "
                                          "cross-validation)")
    p.add_argument("profile", help="CSV written by `kvbound profile`")
    p.add_argument("--out", required=True, help="write the [cost] table here (TOML)")
    p.add_argument("--plot", help="write a PNG of the fit here")
    p.add_argument("--profiling", default=str(default_profiling()),
                   help="folder of GPU operator profiles (<gpu>/<model>/mlp.csv) to fit per_token and intercept to "
                        f"as well (default: ${PROFILING_ENV}, else ../shared/data/profiling beside the repository; "
                        "skipped if absent)")
    p.add_argument("--seed", type=seed, default=0, help="seed of the held-out split (0 to 2^32 - 1)")
    p.add_argument("--knees", type=_knees, default=None,
                   help="batch-token counts where the per-token slope may bend, e.g. 256 or 256,1024; 'none' for the "
                        "plain six-coefficient fit (default: picked by 5-fold cross-validation on the fitted batches)")
    p.add_argument("--decode-share", type=number(float, 0, 1), default=None, metavar="S",
                   help="the decode-only batches together weigh this share of the fit (0 to 1; default: every batch "
                        "the same). For a CUDA profile use 0.5: decode-only batches replay full CUDA graphs with a "
                        "smaller fixed cost than the rest, and they are most of what schedules run (docs/executor.md)")
    p.set_defaults(func=cmd_calibrate)

    p = sub.add_parser("replay", help="execute a schedule on the executor: predicted vs measured latency")
    p.add_argument("case")
    p.add_argument("schedule", help="schedule JSON (from solve/simulate --out)")
    _executor_options(p, shape_required=False)
    p.add_argument("--cost", help="TOML file with a [cost] table (e.g. from calibrate); default: the case's own")
    p.add_argument("--profile", help="the profile CSV the cost was fitted to: report the share of batches whose "
                                     "features lie within its ranges (profile_coverage)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--plot", help="write a PNG of predicted vs measured batch times here")
    p.set_defaults(func=cmd_replay)


def _executor_options(p, *, shape_required: bool) -> None:
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--shape", required=shape_required, metavar="NAME",
                   help=f"model shape: {', '.join(SHAPES)}" + ("" if shape_required else
                                                               " (default: tiny on cpu, llama-2-7b on cuda)"))
    p.add_argument("--layers", type=positive(int), help="decoder layers (default: the shape's own)")
    p.add_argument("--repeat", type=positive(int), default=5,
                   help="time the whole grid or schedule this many times; each batch's fastest run counts "
                        "(default 5)")
    p.add_argument("--threads", type=positive(int), default=1,
                   help="CPU threads for torch (default 1: steady timings on a shared machine; use the same "
                        "number to profile and to replay)")
    p.add_argument("--seed", type=seed, default=0, help="seed of the weights and token ids (0 to 2^32 - 1)")
    p.add_argument("--no-graphs", action="store_true",
                   help="run every batch eagerly (on cuda decode-only batches replay captured CUDA graphs by default, "
                        "and mixed ones piecewise graphs); use the same setting to profile and to replay")
    p.add_argument("--piecewise-tokens", type=number(int, 0, MAX_INT), default=None, metavar="N",
                   help="on cuda, mixed and prefill batches of up to N tokens run as piecewise CUDA graphs, larger "
                        "ones eagerly (default 1024; 0: all eagerly); use the same setting to profile and to replay")
    p.add_argument("--prefill-split", action="store_true",
                   help="on cuda, split-K prefill attention where its programs are too few to fill the GPU (a short "
                        "chunk after a long cached prefix), and one attention kernel for every mixed batch with up to "
                        "8,192 cached decode tokens; use the same setting to profile and to replay")


def _torch(device: str):
    """torch, ready for `device`; bad input (exit 2) when it is missing or has no such device."""
    try:
        import torch
    except ImportError:
        raise KvboundError("this command needs torch and triton: install kvbound[executor] "
                           "(on CPU machines `pip install torch==2.13.0` first)") from None
    if device == "cuda" and not torch.cuda.is_available():
        raise InputError("--device", "", "cuda: no CUDA device is available")
    return torch


def _shape(args):
    from ..engine_bridge.config import model_shape
    return model_shape(args.shape or ("tiny" if args.device == "cpu" else "llama-2-7b"), args.layers)


def cmd_profile(args) -> int:
    torch = _torch(args.device)
    from ..engine_bridge.executor import Executor
    from ..engine_bridge.profile import grid, run_profile, write_profile_csv

    shape = _shape(args)
    torch.set_num_threads(args.threads)
    points = grid(args.device)
    np.random.default_rng(args.seed).shuffle(points)  # so that --points K takes a random subset
    points = points[:args.points]
    out = Path(args.out)
    if not out.parent.is_dir():
        raise InputError(str(out), "", "its folder does not exist")
    executor = Executor.build(shape, device=args.device, max_tokens=max(p.kv_tokens for p in points),
                              max_sequences=max(p.prefill_requests + p.decode_requests for p in points),
                              max_seq_len=max(p.max_seq_len for p in points), seed=args.seed,
                              graphs=False if args.no_graphs else None, piecewise_tokens=args.piecewise_tokens,
                              prefill_split=args.prefill_split)
    executor.warm_up()
    rows = run_profile(executor, points, repeat=args.repeat, seed=args.seed)
    write_profile_csv(out, rows)
    seconds = np.array([r[-2] for r in rows])  # the last column is the preparation time
    print(f"{len(rows)} batches on {args.device} ({shape.name}, {shape.layers} layers, {args.threads} thread(s)): "
          f"{seconds.min() * 1e3:.2f} to {seconds.max() * 1e3:.2f} ms; written to {out}")
    return 0


def _knees(text: str) -> tuple[int, ...]:
    """`--knees`: increasing positive integers separated by commas, or `none`."""
    if text.strip().lower() == "none":
        return ()
    try:
        knees = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected integers separated by commas, or none") from None
    if any(k < 1 for k in knees) or any(b <= a for a, b in zip(knees, knees[1:])):
        raise argparse.ArgumentTypeError(f"{text!r}: knees must be increasing integers >= 1")
    return knees


def cmd_calibrate(args) -> int:
    from ..costs import FEATURES
    from ..costs.operator_profiles import fit_operator_profile
    from ..costs.calibrate import calibrate, cost_toml, read_profile

    features, seconds = read_profile(args.profile)
    cal = calibrate(features, seconds, seed=args.seed, knees=args.knees, decode_share=args.decode_share)
    held, fit = cal.held_out_quality, cal.train_quality
    print(f"{args.profile}: {len(seconds)} batches, {len(cal.train)} fitted, {len(cal.held_out)} held out")
    for name in FEATURES:
        print(f"  {name:<20} {getattr(cal.cost, name):.6g} s")
    how = "picked by cross-validation on the fitted batches" if cal.knees_chosen else "given"
    for knee, slope in zip(cal.cost.token_knees, cal.cost.per_token_above):
        print(f"  per_token_above {knee:<5} {slope:.6g} s  (knee {how})")
    if not cal.cost.token_knees:
        print(f"  no token knee ({'none improved the cross-validated error by 5%' if cal.knees_chosen else 'none given'})")
    if cal.intercept_clamped:
        print("  (the fit put the intercept at 0; raised to 1e-9 s: the cost model needs intercept > 0)")
    print(f"held-out batches: R^2 {held.r2:.4f}, relative error mean {held.mean_relative_error:.1%}, "
          f"max {held.max_relative_error:.1%}")
    print(f"fitted batches:   R^2 {fit.r2:.4f}, relative error mean {fit.mean_relative_error:.1%}, "
          f"max {fit.max_relative_error:.1%}")

    operator_fits = []
    profiling = Path(args.profiling)
    files = sorted(profiling.glob("*/*/mlp.csv")) if profiling.is_dir() else []
    shown = os.path.relpath(profiling)  # ../shared/data/profiling from the repository
    if files:
        print(f"GPU operator profiles in {shown} (non-attention operators x {_OPERATOR_LAYERS} layers; "
              "seed paper: R^2 0.999 on a100/llama-2-7b):")
    else:
        print(f"GPU operator profiles: none in {shown}, skipped")
    for path in files:
        name = f"{path.parent.parent.name}/{path.parent.name}"
        op = fit_operator_profile(path, layers=_OPERATOR_LAYERS)
        print(f"  {name:<18} {op.rows} batches: intercept {op.intercept:.6g} s, per_token {op.per_token:.6g} s, "
              f"R^2 {op.r2:.4f}")
        operator_fits.append((name, path, op))

    weighing = f" --decode-share {args.decode_share:g}" if args.decode_share is not None else ""
    comment = (f"kvbound calibrate {args.profile}{weighing}: {len(seconds)} batches, {len(cal.held_out)} held out: "
               f"R^2 {held.r2:.4f}, relative error mean {held.mean_relative_error:.1%}, "
               f"max {held.max_relative_error:.1%}")
    out = write_user_file(args.out, cost_toml(cal.cost, comment))
    print(f"[cost] written to {out}")
    if args.plot:
        from ..engine_bridge.plots import plot_calibration
        lines = [(f"{name} (R$^2$ {op.r2:.4f})", *_operator_points(path), op.intercept, op.per_token)
                 for name, path, op in operator_fits]
        plot_calibration(args.plot, cal.cost.predict(features), seconds, cal.held_out,
                         f"executor profile: held-out R$^2$ {held.r2:.3f}, mean error {held.mean_relative_error:.1%}",
                         lines)
        print(f"plot written to {args.plot}")
    return 0


def _operator_points(path: Path) -> tuple[np.ndarray, np.ndarray]:
    import csv
    with open(path, newline="", encoding="utf-8") as handle:
        rows = [r for r in csv.DictReader(handle) if int(float(r["num_tensor_parallel_workers"])) == 1]
    cols = [c for c in rows[0] if c.startswith("time_stats.") and c.endswith(".mean")]
    tokens = np.array([float(r["num_tokens"]) for r in rows])
    seconds = np.array([sum(float(r[c]) for c in cols) for r in rows]) * _OPERATOR_LAYERS / 1000.0
    return tokens, seconds


def cmd_replay(args) -> int:
    instance = load_case(args.case)
    schedule = load_schedule(args.schedule)
    try:
        validate(instance, schedule)
    except ScheduleError as exc:
        raise InputError(args.schedule, "", f"invalid schedule for {args.case}: {exc}") from None
    cost = load_cost_file(args.cost) if args.cost else instance.cost
    from ..costs.calibrate import profile_coverage, read_profile
    profile = read_profile(args.profile)[0] if args.profile else None
    shape = _shape(args)
    torch = _torch(args.device)
    from ..engine_bridge.executor import Executor

    torch.set_num_threads(args.threads)
    executor = Executor.for_instance(instance, shape, device=args.device, seed=args.seed,
                                     graphs=False if args.no_graphs else None, piecewise_tokens=args.piecewise_tokens,
                              prefill_split=args.prefill_split)
    executor.warm_up()
    from tqdm import tqdm
    with tqdm(total=args.repeat * len(schedule.batches), desc="replay", unit="batch", disable=None) as bar:
        result = executor.replay(instance, schedule, repeat=args.repeat, seed=args.seed,
                                 on_batch=lambda _: bar.update())
    predicted, measured = result.predicted(cost), result.measured
    rel = np.abs(predicted - measured) / measured
    summary = {
        "device": args.device,
        "shape": shape.name,
        "batches": len(measured),
        "predicted_total": float(predicted.sum()),
        "measured_total": float(measured.sum()),
        "total_relative_error": float(abs(predicted.sum() - measured.sum()) / measured.sum()) if len(measured) else 0.0,
        "mean_batch_relative_error": float(rel.mean()) if len(rel) else 0.0,
        "max_batch_relative_error": float(rel.max()) if len(rel) else 0.0,
        "per_batch": [{"predicted": float(p), "measured": float(m), "prepare": float(h), "path": path,
                       "decode_requests": d, "features": f.tolist()}
                      for p, m, h, path, d, f in zip(predicted, measured, result.prepare_seconds, result.paths,
                                                     result.decode_requests, result.features)],
        "prepare_total": float(result.prepare_seconds.sum()),  # host preparation, in neither total above
        "paths": dict(Counter(result.paths)),
    }
    if profile is not None:
        summary["profile_coverage"] = profile_coverage(profile, result.features)
    if args.json:
        print(json.dumps(summary))
    else:
        _print_replay(args, shape, result, predicted, measured, rel, summary)
    if args.plot:
        from ..engine_bridge.plots import plot_replay
        plot_replay(args.plot, predicted, measured,
                    f"{instance.name or args.case} on {args.device} ({shape.name}, {shape.layers} layers): total "
                    f"error {summary['total_relative_error']:.1%}, mean batch error "
                    f"{summary['mean_batch_relative_error']:.1%}")
        if not args.json:
            print(f"plot written to {args.plot}")
    return 0


def _print_replay(args, shape, result, predicted, measured, rel, summary) -> None:
    print(f"replay of {args.schedule} on {args.case}: {args.device}, {shape.name} ({shape.layers} layers), "
          f"fastest of {args.repeat} passes per batch")
    print(f"{'batch':>6} {'tokens':>7} {'decode':>6} {'prefill':>7} {'predicted ms':>13} {'measured ms':>12} "
          f"{'error':>7}")
    for j, decode, f, p, m, e in zip(result.batch_index, result.decode_requests, result.features, predicted,
                                     measured, rel):
        print(f"{j:>6} {int(f[1]):>7} {decode:>6} {int(f[5]):>7} {p * 1e3:>13.3f} {m * 1e3:>12.3f} {e:>7.1%}")
    print(f"total: predicted {summary['predicted_total'] * 1e3:.3f} ms, measured {summary['measured_total'] * 1e3:.3f} "
          f"ms, error {summary['total_relative_error']:.1%}; per batch: mean error "
          f"{summary['mean_batch_relative_error']:.1%}, max {summary['max_batch_relative_error']:.1%} "
          f"({summary['batches']} batches); host preparation {summary['prepare_total'] * 1e3:.3f} ms (not timed)")
