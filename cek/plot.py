"""A PNG of bandwidth against row width, one line per (kernel, provider, reduction). Needs
matplotlib."""

from __future__ import annotations

from pathlib import Path


def plot_bandwidth(rows: list[dict], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ImportError("--plot needs matplotlib: pip install matplotlib") from exc
    fig, ax = plt.subplots(figsize=(7, 4.5))
    def key(r):  # a row without a reduction (an older file) is a per-row one
        return r["kernel"], r["provider"], r.get("reduction", "none")

    for line in sorted({key(r) for r in rows}):
        points = sorted((r["n_dim"], r["gb_per_s"]) for r in rows if key(r) == line)
        label = " ".join(line[:2] if line[2] == "none" else line)
        ax.plot([d for d, _ in points], [g for _, g in points], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("D (row width)")
    ax.set_ylabel("GB/s (kernel bytes formula)")
    ax.set_title(f"cek bench on {rows[0]['gpu']}" if rows else "cek bench")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
