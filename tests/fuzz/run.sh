#!/bin/sh
# tests/fuzz/run.sh — runs the libFuzzer targets of a -DGS_FUZZ=ON build for a bounded time each.
#   tests/fuzz/run.sh BUILD_DIR [TARGET...]      (default: every target)
# Environment: FUZZ_SECONDS (per target, default 15), FUZZ_MAX_LEN (default 4096),
#   FUZZ_WORK (scratch folder, default BUILD_DIR/fuzz-work).
# Each target starts from its committed corpus (tests/fuzz/corpus/<target>/, replayed first, so
# every regression input there runs on each call) plus what earlier runs kept in FUZZ_WORK; new
# inputs go to FUZZ_WORK only. Crash / leak / timeout inputs are written to FUZZ_WORK/artifacts/.
# Then every input of tests/fuzz/xfail/<target>/ (known crashes whose fix is pending elsewhere) is
# replayed: it must still fail; one that passes fails the run so that it gets moved into the corpus.
# Exit status: 0 when no target crashed and no xfail input passed.
set -u
B=${1:?usage: tests/fuzz/run.sh BUILD_DIR [TARGET...]}
shift
SRC=$(cd "$(dirname "$0")/../.." && pwd)
SECS=${FUZZ_SECONDS:-15}
MAXLEN=${FUZZ_MAX_LEN:-4096}
WORK=${FUZZ_WORK:-$B/fuzz-work}
TARGETS=${*:-"fuzz_safetensors fuzz_tokenizer fuzz_oai_parse fuzz_chat_template fuzz_weights_parse fuzz_http fuzz_store_pickle fuzz_primerl_meta fuzz_torch_ipc fuzz_config"}
mkdir -p "$WORK/artifacts" "$WORK/logs"
fail=0
for t in $TARGETS; do
  bin=$B/tests/fuzz/$t
  [ -x "$bin" ] || { echo "fuzz: $bin is not built"; fail=1; continue; }
  mkdir -p "$WORK/corpus/$t"
  # the HTTP target's server threads allocate between inputs: leaks are the ASan tests' job there
  leaks=1; [ "$t" = fuzz_http ] && leaks=0
  log=$WORK/logs/$t.log
  "$bin" -max_total_time="$SECS" -max_len="$MAXLEN" -timeout=20 -rss_limit_mb=4096 -detect_leaks=$leaks \
    -print_final_stats=1 -artifact_prefix="$WORK/artifacts/$t-" "$WORK/corpus/$t" "$SRC/tests/fuzz/corpus/$t" \
    >"$log" 2>&1
  rc=$?
  stats=$(grep -E '^#[0-9]+' "$log" | tail -n 1)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  if [ $rc -ne 0 ]; then
    echo "fuzz: $t FAILED (exit $rc); log $log; input(s):"; ls "$WORK/artifacts/" | grep "^$t-" | sed 's/^/  /'
    grep -E 'ERROR|SUMMARY|fuzz property' "$log" | head -n 5 | sed 's/^/  /'
    fail=1
  else
    echo "fuzz: $t ok: ${SECS}s, ${execs:-?} execs; $stats"
  fi
  if [ -d "$SRC/tests/fuzz/xfail/$t" ]; then
    for x in "$SRC/tests/fuzz/xfail/$t"/*; do
      [ -f "$x" ] || continue
      if "$bin" -detect_leaks=$leaks -timeout=20 "$x" >"$log.xfail" 2>&1; then
        echo "fuzz: $t XPASS $x: fixed now, move it into tests/fuzz/corpus/$t/ (and its README line)"
        fail=1
      else
        echo "fuzz: $t xfail (still crashes, fix pending): $(basename "$x")"
      fi
    done
  fi
done
exit $fail
