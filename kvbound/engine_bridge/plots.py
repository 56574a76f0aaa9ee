"""PNG figures of a calibration and of a replay (matplotlib, headless Agg backend)."""
from __future__ import annotations

import numpy as np

from ..fileio import save_figure_atomic


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_calibration(path, predicted: np.ndarray, measured: np.ndarray, held_out: np.ndarray, title: str,
                     operator_fits: list[tuple[str, np.ndarray, np.ndarray, float, float]]) -> None:
    """Left: predicted against measured batch time (fitted and held-out batches). Right: the
    operator-profile lines (name, tokens, seconds, intercept, per_token), when there are any."""
    plt = _pyplot()
    from matplotlib import ticker
    panels = 2 if operator_fits else 1
    fig, axes = plt.subplots(1, panels, figsize=(6.2 * panels, 5.2), squeeze=False)
    ax = axes[0, 0]
    train = np.ones(len(measured), dtype=bool)
    train[held_out] = False
    ms = 1e3
    ax.scatter(measured[train] * ms, predicted[train] * ms, s=12, alpha=0.6, label="fitted batches")
    ax.scatter(measured[~train] * ms, predicted[~train] * ms, s=22, marker="x", color="C3", label="held-out batches")
    lo, hi = min(measured.min(), predicted.min()) * ms, max(measured.max(), predicted.max()) * ms
    ax.plot([lo, hi], [lo, hi], color="0.3", lw=1, label="predicted = measured")
    ax.set(xscale="log", yscale="log", xlabel="measured batch time (ms)", ylabel="predicted batch time (ms)",
           title=title)
    for axis in (ax.xaxis, ax.yaxis):  # plain numbers at 1, 2, 5 x 10^k instead of crowded minor labels
        axis.set_major_locator(ticker.LogLocator(subs=(1, 2, 5)))
        axis.set_major_formatter(ticker.ScalarFormatter())
        axis.set_minor_formatter(ticker.NullFormatter())
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="upper left")
    if operator_fits:
        ax = axes[0, 1]
        for k, (name, tokens, seconds, intercept, per_token) in enumerate(operator_fits):
            ax.scatter(tokens, seconds * ms, s=6, color=f"C{k}", alpha=0.5)
            xs = np.array([0, tokens.max()])
            ax.plot(xs, (intercept + per_token * xs) * ms, color=f"C{k}", label=name)
        ax.set(xlabel="tokens in the batch", ylabel="non-attention time, 32 layers (ms)",
               title="GPU operator profiles (Vidur): linear fits")
        ax.grid(True, alpha=0.3)
        ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    save_figure_atomic(fig, path, dpi=110)
    plt.close(fig)


def plot_replay(path, predicted: np.ndarray, measured: np.ndarray, title: str) -> None:
    """Top: predicted and measured time of every batch. Bottom: cumulative latency."""
    plt = _pyplot()
    from matplotlib import ticker
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True)
    batches = np.arange(len(measured))
    ms = 1e3
    top.plot(batches, measured * ms, marker="o", ms=3, lw=1, label="measured")
    top.plot(batches, predicted * ms, marker="x", ms=4, lw=1, label="predicted (cost model)")
    top.set(ylabel="batch time (ms)", title=title)
    top.grid(True, alpha=0.3)
    top.legend()
    bottom.plot(batches, np.cumsum(measured) * ms, label="measured")
    bottom.plot(batches, np.cumsum(predicted) * ms, ls="--", label="predicted")
    bottom.set(xlabel="batch (non-empty batches, in schedule order)", ylabel="cumulative time (ms)")
    bottom.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
    bottom.grid(True, alpha=0.3)
    bottom.legend()
    fig.tight_layout()
    save_figure_atomic(fig, path, dpi=110)
    plt.close(fig)
