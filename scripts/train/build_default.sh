#!/usr/bin/env bash
# Rebuilds the default model pair under artifacts/default/ from scratch, on the CPU, with fixed seeds:
#   corpus + tokenizer (data.py) -> target (train_target.py) -> DFlash b8 and DSpark b7 drafters
#   (train_drafter.py) -> parity checks against graphswap and the float64 reference (check_parity.py)
#   -> training report, loss curves and manifest (report.py).
# Needs: the Debian package python3.11-doc (the corpus), a built graphswap (make build), and a venv
# with torch, tokenizers, safetensors and numpy from PyPI (made here in $VENV if missing).
#   bash scripts/train/build_default.sh            (about 75 minutes on 2 cores)
# env: VENV (build-train/venv), WORK (build-train), OUT (artifacts/default), GS (build/graphswap)
set -euo pipefail
cd "$(dirname "$0")/../.."
WORK=${WORK:-build-train}
VENV=${VENV:-$WORK/venv}
OUT=${OUT:-artifacts/default}
GS=${GS:-build/graphswap}
[ -x "$GS" ] || { echo "build graphswap first (make build)" >&2; exit 2; }
if [ ! -d /usr/share/doc/python3.11/html/_sources ]; then
  if [ "$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi
  $SUDO apt-get install -y -qq python3.11-doc
fi
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q torch tokenizers safetensors numpy
fi
PY="$VENV/bin/python"
mkdir -p "$WORK" "$OUT"
"$PY" scripts/train/data.py --out "$WORK/data"
"$PY" scripts/train/train_target.py --data "$WORK/data" --out "$OUT/target" 2>&1 | tee "$WORK/target.log"
for kind in dflash dspark; do
  dst=$OUT/dflash-b8; [ $kind = dspark ] && dst=$OUT/dspark-b7
  "$PY" scripts/train/train_drafter.py --kind $kind --target "$OUT/target" --data "$WORK/data" --out "$dst" \
    --graphswap "$GS" 2>&1 | tee "$WORK/$kind.log"
done
mkdir -p eval/prompts
cp "$WORK/data/heldout.jsonl" eval/prompts/heldout.jsonl
"$PY" scripts/train/check_parity.py "$OUT" "$GS" eval/prompts/heldout.jsonl | tee "$WORK/parity.log"
python3 scripts/train/report.py "$OUT"
