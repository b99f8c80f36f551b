"""Training report and manifest of the default pair (standard library only).

    python3 scripts/train/report.py artifacts/default

Reads <dir>/{target,dflash-b8,dspark-b7}/train_log.json and writes
  <dir>/training.svg   loss curves (target: training loss and held-out loss; drafters: training
                       loss and teacher-forced acceptance length on held-out sequences)
  <dir>/TRAINING.md    the figures (held-out perplexity, final losses, tau, parameters, seconds)
  <dir>/MANIFEST.sha256  sha256sum lines of every shipped file (checked by `sha256sum -c` and by
                       tests/integration/test_default_pair.py)
"""
import hashlib
import json
import math
import os
import sys

PARTS = [("target", "target"), ("dflash-b8", "DFlash b8"), ("dspark-b7", "DSpark b7")]
SHIPPED = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
           "generation_config.json", "train_log.json")


def smooth(ys, k=25):
    out, acc = [], []
    for y in ys:
        acc.append(y)
        acc = acc[-k:]
        out.append(sum(acc) / len(acc))
    return out


def panel(x0, y0, w, h, title, series, ylabel):
    """series: (label, colour, [(x, y)], dots?)"""
    pts = [p for _, _, s, _ in series for p in s]
    xmax = max(p[0] for p in pts) or 1
    ylo, yhi = min(p[1] for p in pts), max(p[1] for p in pts)
    if yhi - ylo < 1e-9:
        yhi = ylo + 1
    pad = (yhi - ylo) * 0.05
    ylo, yhi = ylo - pad, yhi + pad
    X = lambda v: x0 + 50 + (w - 60) * v / xmax  # noqa: E731
    Y = lambda v: y0 + h - 30 - (h - 60) * (v - ylo) / (yhi - ylo)  # noqa: E731
    s = [f'<text x="{x0 + w / 2}" y="{y0 + 18}" text-anchor="middle" font-weight="bold">{title}</text>',
         f'<line x1="{X(0)}" y1="{Y(ylo)}" x2="{X(xmax)}" y2="{Y(ylo)}" stroke="black"/>',
         f'<line x1="{X(0)}" y1="{Y(ylo)}" x2="{X(0)}" y2="{Y(yhi)}" stroke="black"/>',
         f'<text x="{x0 + w / 2}" y="{y0 + h - 5}" text-anchor="middle">step</text>',
         f'<text x="{x0 + 12}" y="{y0 + h / 2}" transform="rotate(-90 {x0 + 12} {y0 + h / 2})" '
         f'text-anchor="middle">{ylabel}</text>']
    for i in range(5):
        v = ylo + (yhi - ylo) * i / 4
        s.append(f'<text x="{X(0) - 4}" y="{Y(v) + 4}" text-anchor="end" font-size="10">{v:.2f}</text>')
        xv = xmax * i / 4
        s.append(f'<text x="{X(xv)}" y="{Y(ylo) + 14}" text-anchor="middle" font-size="10">{xv:.0f}</text>')
    for i, (label, col, ser, dots) in enumerate(series):
        if dots:
            s += [f'<circle cx="{X(a):.1f}" cy="{Y(b):.1f}" r="3" fill="{col}"/>' for a, b in ser]
        path = " ".join(f"{X(a):.1f},{Y(b):.1f}" for a, b in ser)
        s.append(f'<polyline points="{path}" fill="none" stroke="{col}" stroke-width="1.5"/>')
        s.append(f'<text x="{x0 + w - 10}" y="{y0 + 36 + 14 * i}" text-anchor="end" fill="{col}">{label}</text>')
    return s


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def main():
    root = sys.argv[1]
    logs = {k: json.load(open(os.path.join(root, k, "train_log.json"))) for k, _ in PARTS}
    W, Hp = 520, 300
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * W}" height="{2 * Hp}" '
           f'font-family="sans-serif" font-size="12">', '<rect width="100%" height="100%" fill="white"/>']
    t = logs["target"]
    svg += panel(0, 0, W, Hp, "target: loss (nats/token)",
                 [("training (mean of 25 steps)", "#1f77b4",
                   list(zip([s["step"] for s in t["steps"]], smooth([s["loss"] for s in t["steps"]]))), False),
                  ("held out", "#d62728", [(e["step"], e["heldout_loss"]) for e in t["evals"]], True)], "loss")
    for i, (k, name) in enumerate(PARTS[1:]):
        d = logs[k]
        svg += panel((i + 1) % 2 * W, (i + 1) // 2 * Hp, W, Hp, f"{name}: training loss",
                     [("training (mean of 25 steps)", "#1f77b4",
                       list(zip([s["step"] for s in d["steps"]], smooth([s["loss"] for s in d["steps"]]))), False)],
                     "loss")
    svg += panel(W, Hp, W, Hp, "drafters: teacher-forced tau (held-out sequences)",
                 [(name, col, [(e["step"], e["tau_tf"]) for e in logs[k]["evals"]], True)
                  for (k, name), col in zip(PARTS[1:], ["#2ca02c", "#9467bd"])], "tau")
    svg.append("</svg>")
    with open(os.path.join(root, "training.svg"), "w") as f:
        f.write("\n".join(svg) + "\n")
    last = t["evals"][-1]
    md = ["# Training report of the default pair", "",
          "Written by scripts/train/report.py from the train_log.json files; curves in training.svg.", "",
          "| model | parameters | steps | seconds | figure |", "|---|---|---|---|---|",
          f"| target (Qwen3) | {t['params'] / 1e6:.1f}M | {len(t['steps'])} | {t['seconds']:.0f} | "
          f"held-out loss {last['heldout_loss']:.3f}, perplexity {math.exp(last['heldout_loss']):.2f} "
          f"({t['heldout_tokens']} held-out tokens) |"]
    for k, name in PARTS[1:]:
        d = logs[k]
        e = d["evals"][-1]
        md.append(f"| {name} | | {len(d['steps'])} | {d['seconds']:.0f} | teacher-forced tau {e['tau_tf']:.2f}, "
                  f"slot accuracy {e['slot_accuracy']} |")
    with open(os.path.join(root, "TRAINING.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    lines = []
    for k, _ in PARTS:
        for fn in SHIPPED:
            p = os.path.join(root, k, fn)
            if os.path.exists(p):
                lines.append(f"{sha256(p)}  {k}/{fn}")
    for fn in ("training.svg", "TRAINING.md"):
        lines.append(f"{sha256(os.path.join(root, fn))}  {fn}")
    with open(os.path.join(root, "MANIFEST.sha256"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
