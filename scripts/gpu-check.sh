#!/usr/bin/env bash
# The checks that need a CUDA GPU, as one command (docs/development.md,
# "GPU checks"):
#
#   scripts/gpu-check.sh --prepare [--into DIR] [SHARED]
#       here, with Go: builds bin/ (vramscope and the test binaries), copies
#       SHARED/testdata/pytorch-2.11 into shared/, checks that what travels
#       stays under 64 MiB, and prints the device command and its carry list
#   scripts/gpu-check.sh [--out DIR] [--only a,b] [--budget S] [--limit NAME=S] [--steps N] [--bin DIR] [SHARED]
#       on the GPU machine: runs the checks
#
# The checks, in order of value, each under its own time limit (seconds):
#   estimate   90  issue 40: record.py's training estimated on FakeTensorMode's CUDA, against train_default.pickle
#   placement 100  issue 39: record.py frag and train afresh; the simulated driver's placement and bisection on them
#   batch     150  #31, issue 36: batch 16 predicted from 4 and 8, against the real allocator; the DDP ranks fitted
#   cuda       75  #29: gpu/cuda's GPU tests; vramscope trace --device cuda of frag, without and with expandable segments
#   live      110  #28, issue 38: a training job watched live against alone; steps read whole on request
# A limit is cut to what is left of --budget (default 480 s); a check cut
# to under 30 s is not run. Each prints a table and a verdict; the last
# thing printed is the table of verdicts. --out DIR gets summary.txt (that
# table), log.txt (everything printed) and results.tar.gz (each check's
# commands and output, the recordings made, their figures).
#
# SHARED holds testdata/pytorch-2.11 (default: $VRAMSCOPE_SHARED, else
# shared/ or ../shared beside the checkout). The Python is $PYTHON (default
# python3). Binaries: those in --bin DIR, else built into a temporary
# folder where go is on PATH, else bin/ (made by --prepare). Status: 0 when
# every check run passed (or had nothing to check), 1 when one failed or
# ran out of time, 2 when this machine lacks what the checks need.
set -uo pipefail
cd "$(dirname "$0")/.."

CHECKS=(estimate placement batch cuda live)
declare -A LIMIT=([estimate]=90 [placement]=100 [batch]=150 [cuda]=75 [live]=110)
BINARIES=(vramscope cuda.test sim.test replay.test)
MAX_CARRY=$((64 << 20))

die() { # status message
  echo "gpu-check: $2" >&2
  exit "$1"
}

find_shared() { # [given]: the folder holding testdata/pytorch-2.11
  local d given=${1:-${VRAMSCOPE_SHARED:-}} places=(shared ../shared)
  [ -n "$given" ] && places=("$given")
  for d in "${places[@]}"; do
    if [ -f "$d/testdata/pytorch-2.11/record.py" ] && [ -f "$d/testdata/pytorch-2.11/train_default.pickle" ]; then
      echo "$d"
      return
    fi
  done
  [ -n "$given" ] && die 2 "$given holds no testdata/pytorch-2.11 with record.py and train_default.pickle"
  die 2 "the real recordings (SHARED/testdata/pytorch-2.11) are not here: give their folder"
}

mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }

prepare() { # into shared
  local into=$1 src
  src=$(find_shared "$2")
  command -v go >/dev/null || die 2 "--prepare builds the binaries: it needs go"
  mkdir -p "$into/bin" || exit 2
  echo "gpu-check: building ${BINARIES[*]} into $into/bin"
  go build -trimpath -ldflags "-s -w" -o "$into/bin/vramscope" ./cmd/vramscope || die 1 "go build failed"
  go test -c -trimpath -ldflags "-s -w" -o "$into/bin/" ./gpu/cuda ./gpu/sim ./replay || die 1 "go test -c failed"
  { echo "commit $(git describe --always --dirty 2>/dev/null || echo unknown)"
    echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) with $(go version | cut -d' ' -f3-)"; } >"$into/bin/BUILD"
  echo "gpu-check: copying $src/testdata/pytorch-2.11 into $into/shared/testdata"
  rm -rf "$into/shared/testdata/pytorch-2.11"
  mkdir -p "$into/shared/testdata" && cp -R "$src/testdata/pytorch-2.11" "$into/shared/testdata/" || die 1 "copying the recordings failed"
  chmod -R u+w "$into/shared/testdata/pytorch-2.11"

  # What travels: the working tree (tracked files and untracked ones git
  # does not ignore), shared/ and the carried bin/.
  local tree carried total name
  tree=$(git ls-files -z --cached --others --exclude-standard -- ':!:bin' ':!:shared' |
    xargs -0 stat -c %s 2>/dev/null | awk '{ s += $1 } END { print s + 0 }')
  carried=$(du -sb "$into/bin" "$into/shared" | awk '{ s += $1 } END { print s + 0 }')
  total=$((tree + carried))
  echo "gpu-check: bin/ and shared/ $(mib "$carried"), the working tree $(mib "$tree"): $(mib "$total") of $(mib "${GPU_CHECK_MAX_CARRY:-$MAX_CARRY}") that may travel"
  [ "$total" -le "${GPU_CHECK_MAX_CARRY:-$MAX_CARRY}" ] ||
    die 1 "what would travel is $(mib "$total"), over $(mib "${GPU_CHECK_MAX_CARRY:-$MAX_CARRY}"): leave something out"
  for name in bin shared; do
    if [ "$into" = . ] && ! git check-ignore -q "$name/"; then
      die 1 "$name/ is not ignored by git: it would be committed (add /$name/ to .gitignore)"
    fi
  done
  cat <<EOF
gpu-check: ready. On a lent GPU (the device tool's run), one call:
  command:   scripts/gpu-check.sh --out "\$OUT"
  carry:     ["bin", "shared"]
  timeout_s: 560
It runs about 5 minutes, at most 8 (--budget 480 s and a start-up); the
table of verdicts comes last, and \$OUT brings back summary.txt, log.txt and
results.tar.gz. To run one check again while the machine is warm:
scripts/gpu-check.sh --out "\$OUT" --only NAME; else give it back at once.
EOF
}

# ---------------------------------------------------------------- arguments

mode=run into=. out="" only="" budget=480 steps=300 shared_arg="" bin_arg=""
while [ $# -gt 0 ]; do
  case $1 in
  --prepare) mode=prepare ;;
  --into) into=${2:?--into DIR}; shift ;;
  --out) out=${2:?--out DIR}; shift ;;
  --only) only=${2:?--only NAME,...}; shift ;;
  --budget) budget=${2:?--budget SECONDS}; shift ;;
  --steps) steps=${2:?--steps N}; shift ;;
  --bin) bin_arg=${2:?--bin DIR}; shift ;;
  --limit)
    l=${2:?--limit NAME=SECONDS}
    [ -n "${LIMIT[${l%%=*}]+x}" ] && [[ ${l#*=} =~ ^[0-9]+$ ]] || die 2 "--limit $l: want NAME=SECONDS, NAME one of ${CHECKS[*]}"
    LIMIT[${l%%=*}]=${l#*=}
    shift ;;
  -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  -*) die 2 "unknown flag $1 (--help lists them)" ;;
  *) shared_arg=$1 ;;
  esac
  shift
done
[[ $budget =~ ^[0-9]+$ ]] || die 2 "--budget $budget: want whole seconds"
[[ $steps =~ ^[0-9]+$ ]] && [ "$steps" -ge 10 ] || die 2 "--steps $steps: want 10 or more"
selected=("${CHECKS[@]}")
if [ -n "$only" ]; then
  selected=()
  IFS=, read -ra names <<<"$only"
  for n in "${names[@]}"; do
    [ -n "${LIMIT[$n]+x}" ] || die 2 "--only $only: no check $n (${CHECKS[*]})"
  done
  for n in "${CHECKS[@]}"; do
    [[ ",$only," == *",$n,"* ]] && selected+=("$n")
  done
fi

if [ $mode = prepare ]; then
  prepare "$into" "$shared_arg"
  exit 0
fi

# ---------------------------------------------------------------- what the checks need

shared=$(find_shared "$shared_arg") || exit 2
recordings=$shared/testdata/pytorch-2.11
python=${PYTHON:-python3}
device=$("$python" - 2>&1 <<'EOF'
import sys
try:
    import torch
except Exception as e:
    sys.exit("cannot import torch (%s)" % e)
if not torch.cuda.is_available():
    sys.exit("PyTorch %s sees no CUDA GPU (torch.cuda.is_available() is False)" % torch.__version__)
p = torch.cuda.get_device_properties(0)
print("%s, %d B, PyTorch %s, CUDA %s" % (p.name, p.total_memory, torch.__version__, torch.version.cuda))
EOF
) || die 2 "no CUDA GPU here: $python: ${device##*$'\n'}. These checks run on a machine with one; prepare them here with --prepare."
device=${device##*$'\n'} # the last line: what it printed before (a warning of PyTorch's) aside
command -v timeout >/dev/null || die 2 "no timeout (coreutils) to hold each check to its limit"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ -n "$out" ]; then
  mkdir -p "$out" || die 2 "cannot make --out $out"
else
  out=$work/out
  mkdir -p "$out"
fi
bin=${bin_arg:-bin}
build="prepared: $(tr '\n' ' ' <"$bin/BUILD" 2>/dev/null || echo "$bin/BUILD missing")"
if [ -z "$bin_arg" ] && command -v go >/dev/null; then
  bin=$work/bin build="built now from $(git describe --always --dirty 2>/dev/null || echo 'this checkout')"
  { go build -o "$bin/vramscope" ./cmd/vramscope && go test -c -o "$bin/" ./gpu/cuda ./gpu/sim ./replay; } ||
    die 2 "building the binaries failed"
fi
for b in "${BINARIES[@]}"; do
  [ -x "$bin/$b" ] || die 2 "no $bin/$b: run scripts/gpu-check.sh --prepare where Go is, and carry bin/"
done
bin=$(cd "$bin" && pwd)

# ---------------------------------------------------------------- the checks

command_of() { # name limit: sets cmd to the check's command line
  local w=$work/$1 lim=$(($2 > 20 ? $2 - 10 : $2))
  case $1 in
  estimate) cmd=("$python" scripts/gpu_estimate_check.py --vramscope "$bin/vramscope" --python "$python"
    --recordings "$recordings" --work "$w" --limit "$lim") ;;
  placement) cmd=("$python" scripts/gpu_placement_check.py --recordings "$recordings" --rec "$work/rec"
    --sim-test "$bin/sim.test" --replay-test "$bin/replay.test" --python "$python" --work "$w" --limit "$lim") ;;
  batch) cmd=("$python" scripts/gpu_batch_check.py --vramscope "$bin/vramscope" --recordings "$recordings"
    --rec "$work/rec" --python "$python" --work "$w" --limit "$lim") ;;
  cuda) cmd=("$python" scripts/gpu_cuda_check.py --vramscope "$bin/vramscope" --cuda-test "$bin/cuda.test"
    --work "$w" --limit "$lim") ;;
  live) cmd=("$python" scripts/gpu_live_check.py --vramscope "$bin/vramscope" --recordings "$recordings"
    --work "$w" --steps "$steps" --limit "$lim") ;;
  esac
}

run_checks() { # prints everything, the table of verdicts last (also into summary.txt); its status is the verdict
  local name left lim t0 rc line status=0 start=$SECONDS
  local -A verdict summary took given
  echo "gpu-check: $device"
  echo "gpu-check: binaries $build"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total \
    --format=csv,noheader | sed 's/^/gpu-check: nvidia-smi: /'
  for name in "${selected[@]}"; do
    left=$((budget - (SECONDS - start)))
    lim=$((LIMIT[$name] < left ? LIMIT[$name] : left))
    given[$name]=$lim took[$name]=0
    if [ "$lim" -lt 30 ] && [ "$lim" -lt "${LIMIT[$name]}" ]; then
      verdict[$name]="not run" summary[$name]="$left s of the --budget left"
      status=1
      continue
    fi
    mkdir -p "$work/$name"
    echo
    echo "== $name (at most $lim s)"
    command_of "$name" "$lim"
    t0=$SECONDS
    timeout -k 10 "$lim" "${cmd[@]}" 2>&1 | tee "$work/$name/output.txt"
    rc=${PIPESTATUS[0]}
    took[$name]=$((SECONDS - t0))
    line=$(grep '^verdict: ' "$work/$name/output.txt" | tail -1)
    summary[$name]=${line#verdict: *: } # "verdict: ok: why": why
    case $rc in
    0) verdict[$name]=ok ;;
    3) verdict[$name]=n/a ;;
    1) verdict[$name]=FAIL ;;
    124 | 137) verdict[$name]=TIMEOUT summary[$name]="stopped after $lim s (the last it printed is above)" ;;
    *) verdict[$name]=FAIL summary[$name]="status $rc, ${summary[$name]:-no verdict printed}" ;;
    esac
    case ${verdict[$name]} in ok | n/a) ;; *) status=1 ;; esac
  done
  {
    echo
    echo "gpu-check: $device; binaries $build"
    printf '%-10s %-8s %6s %6s  %s\n' CHECK VERDICT TIME LIMIT SUMMARY
    for name in "${selected[@]}"; do
      printf '%-10s %-8s %5ss %5ss  %s\n' "$name" "${verdict[$name]}" "${took[$name]}" "${given[$name]}" "${summary[$name]}"
    done
    if [ $status -eq 0 ]; then echo "gpu-check: every check passed"; else echo "gpu-check: a check failed"; fi
  } | tee "$out/summary.txt"
  return $status
}

run_checks 2>&1 | tee "$out/log.txt"
status=${PIPESTATUS[0]}

# What comes back from the device is at most 16 MiB a file: recordings of
# 4 MiB and more stay behind, listed in recordings.txt.
[ -d "$work/rec" ] && (cd "$work/rec" && ls -l) >"$work/recordings.txt"
cp "$out/log.txt" "$work/log.txt"
(cd "$work" && find . -type f ! -path './bin/*' ! -path './out/*' ! -path './rec/fresh/*' ! -name '*.db*' -size -4M -print0 |
  tar -czf "$out/results.tar.gz" --null -T -) || echo "gpu-check: results.tar.gz could not be made" >&2
exit $status
