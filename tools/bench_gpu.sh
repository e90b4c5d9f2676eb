#!/usr/bin/env bash
# Issue 39 (and issue 3, target 4): the out-of-core benchmarks on a GPU, in parts of under 10
# minutes each (one call's limit). A session is lent 15 minutes of device time in all, each
# call's machine start (about a minute) included: room for one long part and one short one.
# Run 9 first (host_offload, traced, about 150 s), then 2 (target 3's graph) or 4 (the memory
# wall) or 7 (in-memory against PyG, host and SSD). Every run prints its line as it finishes
# (tools/bench_out_of_core.py, tools/trace_epoch.py), so a part cut short still reports what
# it measured. Logs, JSON and traces go to $OUT (default runs/gpu); a trace is read on any
# machine with `python tools/trace_epoch.py --summarize DIR`.
#
#   bash tools/bench_gpu.sh 0    # 1M nodes, host_offload: per-thread profile, without and
#                                # with heap reuse (README, "Allocator settings")
#   bash tools/bench_gpu.sh 5    # the same, serial: each store operation and step alone
#   bash tools/bench_gpu.sh 6    # part 0's first profile with the store's row moves split
#                                # across 4, then 12 threads (jgrind.hostio.rows.set_threads)
#   bash tools/bench_gpu.sh 1    # 1M nodes, 10M edges: in-memory, PyG, device, host, SSD
#   bash tools/bench_gpu.sh 2    # ogbn-products size, 8 GiB device budget, beside PyG
#   bash tools/bench_gpu.sh 3    # the naive scheme beside ssd_offload (target 3)
#   bash tools/bench_gpu.sh 4    # the memory wall (target 1), beside PyG on the GPU
#   bash tools/bench_gpu.sh 7    # issue 39: one host_offload epoch traced (jax.profiler, the
#                                # trace copied to $OUT) with programs compiled per epoch, then
#                                # in-memory, PyG, host and SSD on the 1M-node graph
#   bash tools/bench_gpu.sh 8    # transfers and row moves alone (tools/bench_transfers.py),
#                                # then host_offload's epoch under engine variants, each traced
#   bash tools/bench_gpu.sh 9    # the GPU's hardware profile saved to $OUT/profile.json;
#                                # host_offload as it runs (inputs sent in 8 row ranges), with
#                                # inputs filled into page-locked buffers, and in one piece;
#                                # each traced (about 250 s in all)
#   bash tools/bench_gpu.sh 10   # target 5: the first and later epochs with the engine's
#                                # compile efforts quick (default) and full, cache empty (~300 s)
#   bash tools/bench_gpu.sh 11   # issue 41, target 2: host_offload's bytes and epochs with
#                                # blocks stored in float32, bfloat16 and int8 (~300 s)
#   bash tools/bench_gpu.sh 12   # issue 38, target 5: the multi-device and multi-process
#                                # tests with one GPU (~400 s)
#
# The limits come from the H100 and H200 runs (docs/results-history.md, section 8): an out-of-core
# run's first epoch compiled for 80-113 s; host_offload's epochs took 6.4-8.5 s before the
# pinned host copies and 2.4 s after.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
# Compiled programs, and the GPU's autotuning results, kept on disk across parts and calls
# (runs/ survives between calls on a warm machine): on the first H100 run an out-of-core
# run's first epoch took 84 s against 6.4-6.8 s for the later ones. Warm-up epochs then
# differ between calls; the timed epochs do not depend on it.
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-$PWD/runs/xla-cache}
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=${JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS:-0}
bench="python3 tools/bench_out_of_core.py"

run() {  # run LIMIT NAME ARGS...: one benchmark under a time limit, logged to $OUT/NAME.log
    local limit=$1 name=$2
    shift 2
    echo "== $name (limit ${limit} s): $*"
    timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
}

collect_traces() {  # $OUT/trace-dir/VARIANT/plugins/profile/*/x.xplane.pb -> $OUT/VARIANT.xplane.pb:
    # the device tool brings back files at most two folders down
    for d in "$OUT"/trace-dir/*/; do
        for f in "$d"plugins/profile/*/*.xplane.pb; do
            [ -e "$f" ] && mv "$f" "$OUT/$(basename "$d").xplane.pb"
        done
    done
    rm -rf "$OUT/trace-dir"
}

case "${1:-1}" in
0)  # where the ~100x goes: each thread's time in a normal epoch. On CPU-2 fresh buffers cost
    # the store 9.4 s of a serial epoch and heap reuse 2.0 s (docs/results-history.md, section 4),
    # so the second run says whether the GPU host's store pays the same page faults
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    run 270 profile-overlapped python3 tools/profile_ops.py --rmat 1000000 10000000 \
        --policy host --parts 8 --overlapped
    JGRIND_REUSE_HEAP=1 run 270 profile-overlapped-reuse python3 tools/profile_ops.py \
        --rmat 1000000 10000000 --policy host --parts 8 --overlapped ;;
6)  # the host's cores are idle while the GPU computes: do the gathers and scatter-adds
    # (about 14 GiB per epoch here) go faster split across threads? Compare with part 0
    for t in 4 12; do
        JGRIND_ROW_THREADS=$t run 270 profile-overlapped-threads$t python3 tools/profile_ops.py \
            --rmat 1000000 10000000 --policy host --parts 8 --overlapped
    done ;;
5)  # each operation alone (blocks on each, so the sums are not the normal epoch's)
    run 560 profile-serial python3 tools/profile_ops.py --rmat 1000000 10000000 \
        --policy host --parts 8 --skip-model ;;
1)
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    run 560 overhead $bench overhead --parts 8 --epochs 2 \
        --runs in-memory,pyg,device,host,ssd --json "$OUT/overhead.json" ;;
2)  # target 4's own number first (the budgeted run), so a part cut short by its limit
    # still brings it back; then the whole-graph runs to compare it with
    run 560 products $bench overhead --nodes 2400000 --edges 62000000 --features 100 \
        --parts 16 --epochs 2 --runs budgeted,in-memory,pyg --device-budget 8GiB \
        --host-budget 64GiB --json "$OUT/products.json" ;;
3)
    run 560 naive $bench overhead --parts 8 --epochs 1 --runs ssd,naive \
        --json "$OUT/naive.json" ;;
4)  # one run that prints at its end: give it the whole part
    run 560 memory-wall $bench memory-wall --nodes 3000000 --edges 30000000 --parts 32 \
        --partitioner label_propagation --device-budget 2GiB --host-budget 2GiB --epochs 2 \
        --json "$OUT/memory-wall.json" ;;
7)  # the trace first: where host_offload's epoch goes on this GPU, readable on a CPU later
    # with `python tools/trace_epoch.py --summarize DIR`
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    run 200 trace python3 tools/trace_epoch.py --rmat 1000000 10000000 --policy host \
        --parts 8 --epochs 2 --trace "$OUT/trace-dir"
    # the device tool brings back files at most two folders down
    for f in "$OUT"/trace-dir/plugins/profile/*/*.xplane.pb; do
        [ -e "$f" ] && mv "$f" "$OUT/host-epoch.xplane.pb"
    done
    rm -rf "$OUT/trace-dir"
    run 260 overhead $bench overhead --parts 8 --epochs 2 \
        --runs in-memory,pyg,host,ssd --json "$OUT/overhead.json" ;;
8)  # what each way of moving a step's rows costs here, then the engine's settings side by
    # side on one engine (programs compiled once), each variant's last epoch traced
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    run 100 transfers python3 tools/bench_transfers.py
    run 280 variants python3 tools/trace_epoch.py --rmat 1000000 10000000 --policy host \
        --parts 8 --epochs 2 --variants default,no-early-copies,one-row-thread \
        --trace "$OUT/trace-dir"
    collect_traces ;;
9)  # short: fits the last minutes of a session's device time; "default" sends inputs in 8 pieces.
    # The GPU's hardware profile first (44 s on a warm H200; a 60 s limit cut a cold start's
    # short): issue 38's multi-GPU prediction (tools/predict_devices.py --gpu-profile) and the
    # planner's GPU figures read it on a CPU
    run 150 profile python3 -m jgrind.cli profile --out "$OUT/profile.json"
    run 190 pinned python3 tools/trace_epoch.py --rmat 1000000 10000000 --policy host \
        --parts 8 --epochs 1 --variants default,pinned-inputs,pieces-1 --trace "$OUT/trace-dir"
    collect_traces ;;
10) # target 5 (first epoch <= 2x a later one, compile cache empty). On an H200 the first
    # epoch compiled 49 programs in 101 s with XLA's GPU autotuning and in 12 s without it
    # (then an XLA_FLAGS setting); the engine now compiles its steps without it by default
    # (jgrind.engine.compile_effort.QUICK). This checks that the default really skips it, and
    # what the later epochs lose: each effort in a fresh process, no compile cache, 4 epochs
    unset JAX_COMPILATION_CACHE_DIR
    run 150 effort-quick python3 tools/trace_epoch.py --rmat 1000000 10000000 \
        --policy host --parts 8 --epochs 4 --compile-effort quick
    run 200 effort-full python3 tools/trace_epoch.py --rmat 1000000 10000000 \
        --policy host --parts 8 --epochs 4 --compile-effort full ;;
11) # issue 41, target 2 on a GPU: the blocks are encoded on the device before they cross, so
    # the link carries bfloat16 or int8; on CPU-2 the conversions cost 1.29-1.44x float32's epoch
    # and saved nothing (no link). Bytes per epoch and epoch times, one graph partitioned once
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    run 420 store-dtype python3 tools/bench_store_dtype.py --rmat 1000000 10000000 --parts 8 \
        --epochs 2 --runs host --dtypes float32,bfloat16,int8 --json "$OUT/store-dtype.json" ;;
12) # issue 38, target 5: with one GPU, the device tests compile the GPU collectives' path (a
    # one-device mesh); the cases that force CPU devices or start processes run beside it
    run 500 device-tests python3 -m pytest -q -x -p no:cacheprovider tests/test_devices.py \
        tests/test_devices_out_of_core.py tests/test_processes_out_of_core.py ;;
*)
    echo "usage: bash tools/bench_gpu.sh 0|1|2|...|12" >&2
    exit 2 ;;
esac
