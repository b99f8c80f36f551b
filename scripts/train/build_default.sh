#!/usr/bin/env bash
# Rebuilds the default model pair under artifacts/default/ from scratch, on the CPU, with fixed seeds:
#   corpus + tokenizer (data.py) -> target (train_target.py) -> DFlash b8 and DSpark b7 drafters
#   (train_drafter.py) -> parity checks against graphswap and the float64 reference (check_parity.py)
#   -> training report, loss curves and manifest (report.py).
# Needs: the Debian package python3.11-doc (the corpus), a built graphswap (make build), and a venv
# with torch, tokenizers, safetensors and numpy from PyPI (made here in $VENV if missing).
#   bash scripts/train/build_default.sh            (about 100 minutes on 2 cores)
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
# DFlash: 3072 rollouts and 3500 steps (~35 min); DSpark, whose Markov head learns faster: 1536 and 1500
"$PY" scripts/train/train_drafter.py --kind dflash --target "$OUT/target" --data "$WORK/data" --out "$OUT/dflash-b8" \
  --graphswap "$GS" --seqs 3072 --steps 3500 2>&1 | tee "$WORK/dflash.log"
"$PY" scripts/train/train_drafter.py --kind dspark --target "$OUT/target" --data "$WORK/data" --out "$OUT/dspark-b7" \
  --graphswap "$GS" --seqs 1536 --steps 1500 2>&1 | tee "$WORK/dspark.log"
mkdir -p eval/prompts
cp "$WORK/data/heldout.jsonl" eval/prompts/heldout.jsonl
"$PY" scripts/train/check_parity.py "$OUT" "$GS" eval/prompts/heldout.jsonl | tee "$WORK/parity.log"
python3 scripts/train/report.py "$OUT"
