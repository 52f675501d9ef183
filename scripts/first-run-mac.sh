#!/usr/bin/env bash
# First run on a Mac's Neural Engine: one command that checks the machine, compiles and runs the
# default model on --device ane against the CPU (tokens and logits), times a cold and a warm
# start, and writes ONE file to send back (attach it to an issue titled "first run: <your chip>").
#
#   scripts/first-run-mac.sh [report-file]      (default: anelm-first-run.txt in this directory)
#
# It keeps going when a step fails (a failure is what the report is for) and never touches your
# own compile cache: the cold start uses a fresh cache directory that is deleted at the end.
# Set ANELM_BIN to use an anelm binary you built yourself instead of `cargo build --release`,
# and ANELM_FIRST_RUN_DEVICE=ane-emu to rehearse the whole run on the emulated device (off a Mac).
set -uo pipefail
cd "$(dirname "$0")/.."
report="${1:-$PWD/anelm-first-run.txt}"
prompt="The capital of France is"
tokens=32
ane="${ANELM_FIRST_RUN_DEVICE:-ane}"

now() { perl -MTime::HiRes=time -e 'printf "%.3f\n", time'; }
elapsed() { perl -e 'printf "%.2f", $ARGV[1] - $ARGV[0]' "$1" "$2"; }
say() { echo "$*"; echo "$*" >>"$report"; }
section() { printf '\n==== %s ====\n' "$*" >>"$report"; echo "-- $*"; }
# Run a command, appending its stdout and stderr to the report; its stdout also goes to $2.
run() {
    local out="$1"; shift
    echo "\$ $*" >>"$report"
    "$@" >"$out" 2>"$work/stderr"
    local rc=$?
    cat "$out" "$work/stderr" >>"$report"
    echo "(exit $rc)" >>"$report"
    return $rc
}

work=$(mktemp -d "${TMPDIR:-/tmp}/anelm-first-run.XXXXXX")
trap 'rm -rf "$work"' EXIT
: >"$report"
say "anelm first run on the Neural Engine — $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
say "machine: $(uname -s) $(uname -r) $(uname -m); $(sysctl -n machdep.cpu.brand_string 2>/dev/null || echo unknown chip)"
say "macOS: $(sw_vers -productVersion 2>/dev/null || echo n/a) ($(sw_vers -buildVersion 2>/dev/null || echo n/a))"
say "anelm commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
say "ANELM_ANE_* settings: $(env | grep '^ANELM_ANE_' | tr '\n' ' ' || true)"
if [ "$(uname -s)" != Darwin ] || [ "$(uname -m)" != arm64 ]; then
    say "warning: this is not an Apple-silicon Mac; --device ane will say there is no Neural Engine"
fi

section "build"
if [ -n "${ANELM_BIN:-}" ]; then
    anelm="$ANELM_BIN"
    say "using ANELM_BIN=$anelm"
else
    run "$work/build.out" cargo build --release --quiet -p anelm-cli || { say "FAIL: the build failed (see above)"; exit 1; }
    anelm="$PWD/target/release/anelm"
fi

section "default model"
model=$(scripts/fetch-default-model.sh 2>>"$report") || { say "FAIL: could not fetch the default model"; exit 1; }
say "model: $model"

section "doctor --report"
run "$work/doctor.out" "$anelm" doctor --report "$work/doctor.json" && doctor=ok || doctor=FAIL
[ -f "$work/doctor.json" ] && { echo "--- doctor report (JSON) ---" >>"$report"; cat "$work/doctor.json" >>"$report"; }
say "doctor: $doctor"

# A fresh compile cache: the first run compiles every program (cold), the second loads them (warm).
export ANELM_CACHE_DIR="$work/cache"
gen() { "$anelm" generate --model "$model" --temp 0 -n "$tokens" --device "$1" "$prompt"; }

section "cold start: generate on $ane (compiles every program)"
t0=$(now); run "$work/ane-cold.txt" gen "$ane" && cold=ok || cold=FAIL; t1=$(now)
say "$ane cold: $cold in $(elapsed "$t0" "$t1") s"

section "warm start: generate on $ane (compile cache)"
t0=$(now); run "$work/ane-warm.txt" gen "$ane" && warm=ok || warm=FAIL; t1=$(now)
say "$ane warm: $warm in $(elapsed "$t0" "$t1") s"

section "generate on cpu"
t0=$(now); run "$work/cpu.txt" gen cpu && cpu=ok || cpu=FAIL; t1=$(now)
say "cpu: $cpu in $(elapsed "$t0" "$t1") s"

section "tokens: $ane against cpu (greedy)"
if [ "$cold$cpu" != okok ]; then
    say "tokens: not compared (a run failed)"
elif cmp -s "$work/ane-cold.txt" "$work/cpu.txt"; then
    say "tokens: SAME ($tokens greedy tokens)"
else
    # fp16 on the Neural Engine against fp32 on the CPU may part ways after a near tie.
    same=$(perl -e 'local $/; open my $a, "<", $ARGV[0]; open my $b, "<", $ARGV[1];
        my @a = split " ", <$a>; my @b = split " ", <$b>; my $n = 0;
        $n++ while $n < @a && $n < @b && $a[$n] eq $b[$n]; print "$n of ", scalar(@b)' "$work/ane-cold.txt" "$work/cpu.txt")
    say "tokens: DIFFERENT text; the first $same words agree (the texts are above)"
fi
cmp -s "$work/ane-cold.txt" "$work/ane-warm.txt" && say "cold and warm $ane runs: same text" \
    || say "cold and warm $ane runs: DIFFERENT text"

section "logits: $ane against cpu (last position)"
run "$work/ids.json" "$anelm" tokenize --model "$model" "$prompt"
ids=$(tr -d '[] \n' <"$work/ids.json")
run "$work/logits-ane.json" "$anelm" logits --model "$model" --device "$ane" --token-ids "$ids"
run "$work/logits-cpu.json" "$anelm" logits --model "$model" --device cpu --token-ids "$ids"
cmp_logits=$(perl -MJSON::PP -e '
    sub rd { local $/; open my $f, "<", $_[0] or return; my $j = eval { decode_json(<$f>) } or return; $j->{logits}[-1] }
    my ($a, $c) = (rd($ARGV[0]), rd($ARGV[1]));
    if (!$a || !$c || @$a != @$c) { print "could not compare (a run failed)"; exit }
    my ($d, $m, $ia, $ic) = (0, 0, 0, 0);
    for my $i (0 .. $#$a) {
        my $e = abs($a->[$i] - $c->[$i]); $d = $e if $e > $d;
        $m = abs($c->[$i]) if abs($c->[$i]) > $m;
        $ia = $i if $a->[$i] > $a->[$ia]; $ic = $i if $c->[$i] > $c->[$ic];
    }
    printf "max |ane - cpu| = %.4f (max |cpu| = %.2f, relative %.2e); argmax ane %d, cpu %d: %s",
        $d, $m, $m ? $d / $m : 0, $ia, $ic, $ia == $ic ? "SAME" : "DIFFERENT";
' "$work/logits-ane.json" "$work/logits-cpu.json")
say "logits: $cmp_logits"

section "summary"
say "doctor $doctor; $ane cold $cold; $ane warm $warm; cpu $cpu"
echo
echo "Wrote $report — please attach it to an issue titled \"first run: <your chip>\"."
