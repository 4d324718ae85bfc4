#!/bin/sh
# test_cli.sh - the coda command-line tool on good and bad input: each case's
# exit status (as tools/coda.c's header documents them: 0 success, 1 failed
# check or run, 2 bad usage) and the key part of its message, on the right
# stream (usage asked for on stdout; errors and usage after bad usage on
# stderr).
#
#   tests/test_cli.sh [CODA]      CODA: the built tool, default build/coda
#
# Needs no GPU. Ends with "test_cli.sh: N checks, F failures"; exits 1 on any
# failure. `make test-c` runs it (with $(BUILD)/coda, so test-sanitize runs it
# on the sanitizer build).
set -u

CODA=${1:-build/coda}
case $CODA in /*) ;; *) CODA=$PWD/$CODA ;; esac
if [ ! -x "$CODA" ]; then
    echo "test_cli.sh: $CODA is not an executable (build it first: make)"
    echo "test_cli.sh: 0 checks, 1 failures"
    exit 1
fi
PROGRAMS=$(cd "$(dirname "$0")" && pwd)/programs

T=$(mktemp -d "${TMPDIR:-/tmp}/test_cli.XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT
trap 'exit 1' INT TERM

# Must match CODA_CLI_MAX_PROGRAM_BYTES in tools/coda.c.
LIMIT=1048576
# Every run has a time limit, so a regression that reads forever (the
# /dev/zero case) fails instead of hanging the test.
TIMEOUT=
command -v timeout >/dev/null 2>&1 && TIMEOUT="timeout 120"

checks=0
failures=0

fail() {
    failures=$((failures + 1))
    echo "FAIL: $*"
    sed -n '1,6s/^/    stdout: /p' "$T/out"
    sed -n '1,6s/^/    stderr: /p' "$T/err"
}

# t DESC WANT_STATUS WHERE PATTERN ARGS...
#   Runs coda ARGS (stdin from $IN, default /dev/null); one check: the exit
#   status is WANT_STATUS and PATTERN (a fixed string) is in WHERE: out or err
#   (stdout, stderr), or out-only / err-only (and the other stream is empty).
t() {
    desc=$1 want=$2 where=$3 pat=$4
    shift 4
    $TIMEOUT "$CODA" "$@" <"${IN:-/dev/null}" >"$T/out" 2>"$T/err"
    rc=$?
    checks=$((checks + 1))
    case $where in
    out*) f=$T/out other=$T/err ;;
    err*) f=$T/err other=$T/out ;;
    esac
    if [ "$rc" != "$want" ]; then
        fail "$desc (coda $*): exit status $rc, expected $want"
    elif ! grep -qF -- "$pat" "$f"; then
        fail "$desc (coda $*): std${where%-only} lacks '$pat'"
    else
        case $where in
        *-only) [ -s "$other" ] && fail "$desc (coda $*): expected nothing on the other stream" ;;
        esac
    fi
}

# tin STDIN DESC WANT_STATUS WHERE PATTERN ARGS...: t with stdin from STDIN.
# (Not `IN=x t ...`: whether such an assignment outlives a function call
# differs between shells.)
tin() {
    IN=$1
    shift
    t "$@"
    IN=
}

# also WHERE PATTERN DESC: one more check on the last run's output.
also() {
    checks=$((checks + 1))
    case $1 in out) f=$T/out ;; err) f=$T/err ;; esac
    grep -qF -- "$2" "$f" || fail "$3: std$1 lacks '$2'"
}

# ---- --help / -h: usage on stdout, status 0; for every command ----
for h in --help -h; do
    t "coda $h" 0 out-only "usage: coda <command>" "$h"
    for c in info check programs show demo train version help; do
        t "$c $h" 0 out-only "usage: coda $c" "$c" "$h"
    done
done
t "help" 0 out-only "usage: coda <command>" help
t "help check" 0 out-only "usage: coda check" help check
t "check --help after FILE" 0 out-only "usage: coda check" check nosuch.coda --help
t "--version" 0 out-only "coda " --version
t "version" 0 out-only "coda " version

# ---- bad usage: message and usage on stderr, status 2 ----
t "no command" 2 err-only "usage: coda <command>"
t "unknown command" 2 err-only "unknown command 'frobnicate'" frobnicate
also err "usage: coda <command>" "unknown command"
t "help unknown command" 2 err-only "unknown command 'frobnicate'" help frobnicate
for c in info check programs show demo train version; do
    t "$c: unknown option" 2 err-only "unknown option '--bogus'" "$c" --bogus
    also err "usage: coda $c" "$c: unknown option"
done
t "check: missing FILE" 2 err-only "missing FILE" check
t "check: --cpu, missing FILE" 2 err-only "missing FILE" check --cpu
t "check: extra argument" 2 err-only "unexpected argument 'b.coda'" check a.coda b.coda
t "show: missing NAME" 2 err-only "missing NAME" show
t "show: extra argument" 2 err-only "unexpected argument 'x'" show resid_add x
for c in info programs version; do
    t "$c: extra argument" 2 err-only "unexpected argument 'x'" "$c" x
done
t "help: extra argument" 2 err-only "unexpected argument 'demo'" help check demo
t "demo: extra argument" 2 err-only "unexpected argument 'x'" demo x
t "demo: option without value" 2 err-only "--batch needs a value" demo --batch
t "train: option without value" 2 err-only "--steps needs a value" train --steps
t "train: steps 0" 2 err-only "bad value '0' for --steps" train --steps 0
t "train: steps 1 (no first and last means to compare)" 2 err-only "bad value '1' for --steps" train --steps 1
t "train: a bare word" 2 err-only "unexpected argument 'foo'" train foo
t "train: odd head_dim" 2 err-only "head_dim = d / heads must be a whole even number" train --d 60 --heads 4
t "train: kv-heads not dividing heads" 2 err-only "kv-heads must divide heads" train --heads 4 --kv-heads 3
t "train: lr not a number" 2 err-only "bad value 'x' for --lr" train --lr x
t "train: unknown device" 2 err-only "bad value 'tpu' for --device" train --device tpu
t "demo: batch 0" 2 err-only "--batch takes an integer in 1..4096, not '0'" demo --batch 0
t "demo: seq too big" 2 err-only "--seq takes an integer in 1..4096, not '5000'" demo --seq 5000
t "demo: seed not a number" 2 err-only "--seed takes an integer" demo --seed x1
t "demo: bad device" 2 err-only "--device takes auto, cpu or cuda, not 'gpu'" demo --device gpu

# ---- the commands that work ----
t "programs" 0 out-only "resid_add" programs
t "show" 0 out-only "program resid_add" show resid_add
t "show: unknown program" 1 err-only "no built-in program 'nosuch'" show nosuch
t "info" 0 out "build:" info
if ! grep -q "^cuda: driver" "$T/out"; then
    # no CUDA here: asking for it is a clear failure, before any header
    t "demo --device cuda without CUDA" 1 err-only "CUDA is unavailable" demo --device cuda
fi
t "demo on the CPU" 0 out "demo: all outputs within tolerance" demo --device cpu --batch 1 --seq 8

# ---- check: good programs ----
"$CODA" show resid_add >"$T/ok.coda"
t "check FILE" 0 out-only "program resid_add" check "$T/ok.coda"
tin "$T/ok.coda" "check - (stdin)" 0 out-only "program resid_add" check -
# "--" ends the options: a file whose name starts with '-'
cp "$T/ok.coda" "$T/-dash.coda"
checks=$((checks + 1))
(cd "$T" && $TIMEOUT "$CODA" check -- -dash.coda) </dev/null >"$T/out" 2>"$T/err"
rc=$?
if [ "$rc" != 0 ] || ! grep -qF "program resid_add" "$T/out"; then
    fail "check -- -dash.coda: exit status $rc, expected 0 and the program"
fi

# ---- check: bad programs and bad files, status 1 ----
t "check: parse error" 1 err-only "CODA_ERR_PARSE" check "$PROGRAMS/bad_unknown_op.coda"
also err "bad_unknown_op.coda:line" "check: parse error"
t "check: verify error" 1 err-only "CODA_ERR_VERIFY" check "$PROGRAMS/bad_written_twice.coda"
t "check: missing file" 1 err-only "cannot open $T/nosuch.coda: No such file or directory" check "$T/nosuch.coda"
t "check: directory" 1 err-only "$T is a directory" check "$T"
tin "$T" "check: stdin is a directory" 1 err-only "stdin is a directory" check -
: >"$T/empty.coda"
t "check: empty file" 1 err-only "program is empty" check "$T/empty.coda"
printf '# only a comment\n\n   \n' >"$T/comment.coda"
t "check: only comments" 1 err-only "program is empty" check "$T/comment.coda"
printf 'out o tile f32\na = acc\n\000store o a\n' >"$T/nul.coda"
t "check: NUL byte" 1 err-only "contains a NUL byte" check "$T/nul.coda"
if [ -r /proc/self/mem ]; then
    # reading offset 0 of a process's own memory fails (EIO): a read error
    t "check: read error" 1 err-only "read error" check /proc/self/mem
fi

# ---- check: the size limit ----
if [ -c /dev/zero ]; then
    t "check /dev/zero" 1 err-only "too large" check /dev/zero
    tin /dev/zero "check - < /dev/zero" 1 err-only "too large" check -
fi
# A valid program padded with one comment line to exactly LIMIT bytes is
# read; one byte more is refused.
pad=$((LIMIT - $(wc -c <"$T/ok.coda")))
{ cat "$T/ok.coda"; head -c "$pad" /dev/zero | tr '\000' '#'; } >"$T/limit.coda"
t "check: exactly the limit" 0 out-only "program resid_add" check "$T/limit.coda"
{ cat "$T/limit.coda"; printf '#'; } >"$T/over.coda"
t "check: limit + 1 byte" 1 err-only "too large" check "$T/over.coda"
# It reads no more than LIMIT + 1 bytes: the offset of the stdin it shares
# with this shell tells how far it read.
head -c $((3 * LIMIT)) /dev/zero >"$T/big"
if [ -r /proc/self/fdinfo/0 ]; then
    checks=$((checks + 1))
    pos=$({ $TIMEOUT "$CODA" check - >/dev/null 2>&1; grep '^pos:' /proc/self/fdinfo/0; } <"$T/big")
    pos=$(echo "$pos" | tr -dc 0-9)
    [ "$pos" = $((LIMIT + 1)) ] || fail "check - < 3 MiB: read $pos bytes, expected at most $((LIMIT + 1))"
fi

# ---- check: more arguments than the CUDA backend takes (16) ----
# args N: a valid program of N arguments (N - 1 scalar inputs, one output).
args() {
    i=1
    while [ "$i" -lt "$1" ]; do
        echo "in s$i scalar"
        i=$((i + 1))
    done
    printf 'out o tile f32\na = acc\nstore o a\n'
}
args 16 >"$T/a16.coda"
args 17 >"$T/a17.coda"
args 20 >"$T/a20.coda"
t "check: 16 arguments" 0 out-only "in s15 scalar" check "$T/a16.coda"
t "check: 17 arguments" 1 err-only "17 arguments: the CUDA backend takes at most 16" check "$T/a17.coda"
t "check: 20 arguments" 1 err-only "20 arguments: the CUDA backend takes at most 16" check "$T/a20.coda"
also err "runs on the CPU backend only" "check: 20 arguments"
t "check --cpu: 20 arguments" 0 out "in s19 scalar" check --cpu "$T/a20.coda"
also err "note: 20 arguments: the CUDA backend takes at most 16" "check --cpu: 20 arguments"
t "check FILE --cpu: 20 arguments" 0 out "in s19 scalar" check "$T/a20.coda" --cpu

# ---- output errors: a full disk is a failure, not a success ----
if [ -c /dev/full ]; then
    checks=$((checks + 1))
    $TIMEOUT "$CODA" programs >/dev/full 2>"$T/err"
    rc=$?
    : >"$T/out"
    if [ "$rc" != 1 ] || ! grep -qF "error writing the output" "$T/err"; then
        fail "programs > /dev/full: exit status $rc, expected 1 and 'error writing the output'"
    fi
fi

# ---- train: a small model learns from a text file (the CPU backend) ----
head -c 20000 "$PROGRAMS/../../README.md" > "$T/corpus.txt"
t "train: the loss falls" 0 out "loss " train --data "$T/corpus.txt" --steps 40 --every 20 --d 32 --heads 2 --kv-heads 1 --ffn 64 --seq 32
also out "tokens/s" "train: tokens per second"
t "train: --device cpu" 0 out "CPU backend" train --device cpu --data "$T/corpus.txt" --steps 4 --every 2 --d 32 --heads 2 --kv-heads 1 --ffn 64 --seq 32
t "train: cuda with an odd head_dim" 1 err "needs head_dim = d / heads of 64 or 128" train --device cuda --data "$T/corpus.txt" --steps 2
t "train: missing data file" 1 err "cannot open" train --data "$T/nosuch.txt"
t "train: a directory as data" 1 err "cannot read" train --data "$T"
printf 'tiny' > "$T/tiny.txt"
t "train: data shorter than a window" 1 err "fewer than --seq + 2" train --data "$T/tiny.txt"
head -c 16777217 /dev/zero > "$T/big.bin"
t "train: data over 16 MiB refused, not cut" 1 err "larger than 16 MiB" train --data "$T/big.bin"
rm -f "$T/big.bin"
# the report's mean is over the steps since the last report (a review found
# "mean of the last 3" over 2 steps at step 5 with --every 3)
t "train: the report's mean counts its steps" 0 out "(mean of the last 2:" train --data "$T/corpus.txt" --steps 5 --every 3 --d 32 --heads 2 --kv-heads 1 --ffn 64 --seq 32 --lr 0.01

echo "test_cli.sh: $checks checks, $failures failures"
[ "$failures" = 0 ]
