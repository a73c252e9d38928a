#!/usr/bin/env bash
# The checks that need a CUDA GPU and a recent PyTorch, as one command:
#
#   scripts/gpu-check.sh [SHARED]
#
# SHARED is the folder holding testdata/pytorch-2.11 (default: $VRAMSCOPE_SHARED,
# else shared/ or ../shared beside the checkout). The Python is $PYTHON (default
# python3); vramscope is $VRAMSCOPE, else built here with go, else bin/vramscope.
# Each check prints a table and its verdict; the status is 1 when one fails,
# 2 when the machine lacks what the checks need.
set -uo pipefail
cd "$(dirname "$0")/.."

shared=${1:-${VRAMSCOPE_SHARED:-}}
if [ -z "$shared" ]; then
  for d in shared ../shared; do
    [ -f "$d/testdata/pytorch-2.11/PROVENANCE.md" ] && shared=$d && break
  done
fi
if [ -z "$shared" ] || [ ! -f "$shared/testdata/pytorch-2.11/train_default.pickle" ]; then
  echo "gpu-check: the real recordings (SHARED/testdata/pytorch-2.11) are not here: give their folder" >&2
  exit 2
fi
python=${PYTHON:-python3}
if ! "$python" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "gpu-check: $python has no PyTorch with a CUDA GPU" >&2
  exit 2
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
vramscope=${VRAMSCOPE:-}
if [ -z "$vramscope" ]; then
  if command -v go >/dev/null && go build -o "$tmp/vramscope" ./cmd/vramscope; then
    vramscope=$tmp/vramscope
  elif [ -x bin/vramscope ]; then
    vramscope=bin/vramscope
  else
    echo "gpu-check: no vramscope: set VRAMSCOPE, install go, or put a build in bin/vramscope" >&2
    exit 2
  fi
fi
"$python" -c 'import torch; p = torch.cuda.get_device_properties(0); print("gpu-check: %s, %d B, PyTorch %s, CUDA %s" % (p.name, p.total_memory, torch.__version__, torch.version.cuda))'

status=0
run() { # name command...: runs a check, its verdict in the status
  echo
  echo "== $1"
  shift
  "$@" || status=1
}

# The estimate (python -m vramscope_watch --estimate, FakeTensorMode on
# CUDA) of record.py's training at batch 8 against its real recording.
run "estimate of record.py's training against train_default.pickle" \
  "$python" scripts/gpu_estimate_check.py --vramscope "$vramscope" --python "$python" \
  --recordings "$shared/testdata/pytorch-2.11" --work "$tmp"

echo
if [ $status -eq 0 ]; then echo "gpu-check: every check passed"; else echo "gpu-check: a check failed"; fi
exit $status
