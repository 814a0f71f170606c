# test/build.sh: the build and the shape of the sources: a plain `make` without the build packages names
# them in one line (group build), and the includes follow DESIGN.md's layers (group layers).
# Sourced by test/run.sh, which provides PY and WORK.

# The Makefile's own header check, run on headers made to look absent: a directory first on the include
# path whose jansson.h or zlib.h is an #error, so the compiler fails on it exactly as on a machine
# without the package (nothing is uninstalled). `make -n` parses the Makefile, which is where the check
# runs, and builds nothing.
t_make_missing_deps() {
    local cc ok=0 d=$WORK/nodeps
    cc=$(command -v gcc || command -v cc) || { echo "no C compiler"; return 1; }
    mkdir -p "$d/none" "$d/jansson" "$d/zlib" "$d/both"
    echo '#error not installed' | tee "$d/jansson/jansson.h" "$d/both/jansson.h" "$d/zlib/zlib.h" "$d/both/zlib.h" >/dev/null
    # one line naming the missing headers and their packages (and not the present one), no compiler error
    expect_missing() { # shadow-dir goal present-header names...
        local out rc
        out=$(make -n --no-print-directory CC="$cc -I$d/$1" "$2" 2>&1)
        rc=$?
        echo "make $2 with $1 missing: $out"
        [ $rc -ne 0 ] || { echo "FAIL: make $2 succeeded with $1 missing"; return 1; }
        [ "$(wc -l <<<"$out")" -eq 1 ] || { echo "FAIL: more than one line"; return 1; }
        grep -q "fatal error" <<<"$out" && { echo "FAIL: a compiler error instead of the check"; return 1; }
        grep -q "scripts/deps.sh (or \`make deps\`, as root) installs" <<<"$out" || { echo "FAIL: deps.sh not named"; return 1; }
        [ -z "$3" ] || ! grep -q "$3" <<<"$out" || { echo "FAIL: names $3, which is present"; return 1; }
        local w
        for w in "${@:4}"; do grep -qF "$w" <<<"$out" || { echo "FAIL: does not name $w"; return 1; }; done
    }
    expect_missing jansson all zlib.h jansson.h libjansson-dev || ok=1
    expect_missing zlib all jansson.h zlib.h zlib1g-dev || ok=1
    expect_missing both test-bins "" jansson.h libjansson-dev zlib.h zlib1g-dev || ok=1
    # the control: with nothing hidden the same make passes the check (so the check is not always firing)
    make -n --no-print-directory CC="$cc -I$d/none" all >/dev/null 2>&1 || { echo "FAIL: make -n fails with every header present"; ok=1; }
    # what installs the packages stays reachable without them, and so does clean
    make -n --no-print-directory CC="$cc -I$d/both" deps | grep -qx "bash scripts/deps.sh" || { echo "FAIL: make deps blocked by the check"; ok=1; }
    make -n --no-print-directory CC="$cc -I$d/both" clean >/dev/null 2>&1 || { echo "FAIL: make clean blocked by the check"; ok=1; }
    # no compiler at all: named, with what installs it
    local out
    out=$(make -n --no-print-directory CC="$d/no-such-cc" all 2>&1) && { echo "FAIL: make succeeded without a compiler"; ok=1; }
    echo "without a compiler: $out"
    grep -q "'$d/no-such-cc' is not installed: scripts/deps.sh" <<<"$out" || { echo "FAIL: the missing compiler not named"; ok=1; }
    return $ok
}

t_layers() { $PY scripts/check_layers.py; }

# The checker on a small tree of its own: two includes up the chain, each closing a circle with an
# allowed include back (one of them under an #if: a build option must not turn the chain around); a
# circle inside one row (no include goes up, still a circle); a file in no layer; a top-level file that
# includes emu/ (the tests' emulated GPU); files in emu/ and test/, which are not checked. Then the tree
# made clean passes.
t_layers_fails() {
    local d=$WORK/layers out ok=0
    mkdir -p "$d/emu" "$d/test"
    printf '#include <stdio.h>\n' >"$d/common.h"
    printf '#include "common.h"\n#include "emu/cuda_runtime.h"\n' >"$d/common.c"               # ./train on emu/
    printf '#include "common.h"\n#ifdef X\n#  include "collectives.h"\n#endif\n' >"$d/bootstrap.h" # up, under an #if
    printf '#include "collectives.h"\n' >"$d/algorithms.c"                                     # algorithms -> collectives
    printf '#include "bootstrap.h"\n#include "algorithms.h"\n' >"$d/collectives.c"             # ... -> algorithms
    printf '#include "common.h"\n' >"$d/algorithms.h"
    printf '#include "common.h"\n' >"$d/collectives.h"
    printf '#include "context.h"\n' >"$d/model.c"                                              # one row:
    printf '#include "model.h"\n' >"$d/context.c"                                              # model <-> context
    printf '#include "common.h"\n' | tee "$d/model.h" "$d/context.h" >/dev/null
    printf '#include "train.h"\n' >"$d/stray.c"                                                 # in no layer
    printf '#include "../train.c"\n' | tee "$d/emu/cuda.c" "$d/test/t.c" >/dev/null             # not checked
    out=$($PY scripts/check_layers.py "$d") && { echo "FAIL: the checker passed a tree with violations"; ok=1; }
    echo "$out"
    local want
    for want in "bootstrap.h includes collectives.h: bootstrap may not use collectives" \
        "algorithms.c includes collectives.h: algorithms may not use collectives" \
        "circle: algorithms -> collectives -> algorithms" "circle: bootstrap -> collectives -> bootstrap" \
        "circle: context -> model -> context" "common.c includes emu/cuda_runtime.h: common may not use the emulated GPU" \
        "stray.c: in no layer"; do
        grep -qF "$want" <<<"$out" || { echo "FAIL: not reported: $want"; ok=1; }
    done
    [ "$(grep -c -e ' includes ' -e '^circle: ' -e 'in no layer' <<<"$out")" -eq 7 ] || { echo "FAIL: not exactly those 7 violations"; ok=1; }
    # made clean: collectives may use bootstrap (a row above it); the rest removed
    printf '#include "common.h"\n' >"$d/bootstrap.h"
    printf '#include "algorithms.h"\n' >"$d/algorithms.c"
    printf '#include "model.h"\n' >"$d/model.c"
    printf '#include "common.h"\n' >"$d/common.c"
    rm "$d/stray.c"
    out=$($PY scripts/check_layers.py "$d") || { echo "FAIL: the clean tree failed: $out"; ok=1; }
    return $ok
}
