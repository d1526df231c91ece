#!/usr/bin/env bash
# Runs moe_mpi_fault_test (or moe_cuda_ep_fault_test) under mpirun and judges the job from outside, where a killed or stuck
# process cannot hide:
#   run_fault_test.sh PROGRAM MODE NP VICTIM TIMEOUT_MS [MPIRUN OPTIONS...] [-- PROGRAM OPTIONS...]
# The program gets MODE VICTIM TIMEOUT_MS, then the options after `--`.
# MODE exit|stall|truncate: every rank but the victim (truncate: every rank) must print PASS, and
# the job must end within TIMEOUT_MS plus 15 s of start-up and teardown.
# MODE exit-default: the victim dies under mpirun's default policy, which kills the job: it must
# end, non-zero, within the same bound (the survivors may not get to print).
set -uo pipefail
program=$1 mode=$2 np=$3 victim=$4 timeout_ms=$5
shift 5
mpirun_options=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  mpirun_options+=("$1")
  shift
done
[ $# -gt 0 ] && shift  # the `--`
bound_s=$(( timeout_ms / 1000 + 15 ))
program_mode=${mode%-default}

start=$(date +%s)
output=$(timeout $(( bound_s + 30 ))s "${MOE_MPIEXEC:-mpirun}" --oversubscribe --bind-to none -np "$np" \
  "${mpirun_options[@]}" "$program" "$program_mode" "$victim" "$timeout_ms" "$@" 2>&1)
status=$?
elapsed=$(( $(date +%s) - start ))
echo "$output"
echo "run_fault_test: mode $mode${*:+ ($*)}, $np ranks, victim $victim: exit status $status after ${elapsed} s (bound ${bound_s} s)"

# A program that cannot run here (the GPU one without two GPUs) says SKIP and exits 77 on every
# rank (mpirun --enable-recovery reports 0 then): skipped.
if grep -q '^SKIP' <<<"$output"; then exit 77; fi
fail() { echo "run_fault_test: FAILED: $*"; exit 1; }
[ "$elapsed" -le "$bound_s" ] || fail "the job took ${elapsed} s"
passes=$(grep -c '^rank [0-9]*: PASS' <<<"$output")
if grep -q '^rank [0-9]*: FAIL' <<<"$output"; then fail "a rank reported FAIL"; fi
case "$mode" in
  exit|stall) [ "$passes" -eq $(( np - 1 )) ] || fail "$passes of $(( np - 1 )) survivors passed" ;;
  truncate) [ "$passes" -eq "$np" ] && [ "$status" -eq 0 ] || fail "$passes of $np ranks passed" ;;
  exit-default) [ "$status" -ne 0 ] || fail "the job ended with status 0" ;;
  *) fail "unknown mode $mode" ;;
esac
echo "run_fault_test: passed"
