#!/usr/bin/env bash
# One batched session on a GPU machine (the device tool): GPU tests, a recorded NVML
# snapshot, kill of a TP-like run through the CLI and the dashboard, the dashboard at
# 160x50, the agent benchmarks and the hf backend on GPU. Results go to $OUT.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
if ! command -v tmux >/dev/null; then
  mkdir -p /tmp/tmuxroot && for f in .deb/*.deb; do dpkg -x "$f" /tmp/tmuxroot; done
  export PATH=/tmp/tmuxroot/usr/bin:$PATH LD_LIBRARY_PATH=/tmp/tmuxroot/usr/lib/x86_64-linux-gnu
fi
E3="python3 -m tui.cli"
nvidia-smi -L; python3 --version; tmux -V
echo "== 1. GPU tests"; python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/test_gpu.py tests/test_runner.py 2>&1 | tail -4
echo "== 2. snapshot"; $E3 status local --json > "$OUT/snapshot.json"; python3 -c "
import json; s=json.load(open('$OUT/snapshot.json')); print([(g['index'], g['name'], g['mem_used'], g['util'], g['temp'], g['power']) for g in s['gpus']])"
W=/tmp/w; mkdir -p $W; cat > $W/eagle3.toml <<TOML
[host]
runs_dir = "$W/runs"
[run]
name = "tp-stub"
command = ["python3", "$PWD/bench/tp_stub.py", "--gib", "8"]
cwd = "$W"
graces = [5, 5]
TOML
wait_mem() { for i in $(seq 1 120); do n=$($E3 --config $W/eagle3.toml status local --json | python3 -c "import json,sys; s=json.load(sys.stdin); print(sum(1 for g in s['gpus'] for p in g['processes'] if p['mem'] and p['mem']>7*2**30))"); [ "$n" -ge "$1" ] && return 0; sleep 0.5; done; return 1; }
NG=$(nvidia-smi -L | wc -l)
echo "== 3a. kill via CLI"; $E3 --config $W/eagle3.toml launch local; wait_mem $NG && echo "memory held on $NG GPUs"
t0=$(date +%s.%N); $E3 --config $W/eagle3.toml kill local --yes --json > "$OUT/kill_cli.json"; t1=$(date +%s.%N)
echo "kill CLI wall: $(python3 -c "print(round($t1-$t0,2))") s"; python3 -c "import json; r=json.load(open('$OUT/kill_cli.json')); print({k: r[k] for k in ('ok','gpus_free','elapsed','remaining')}); print(r['gpus'])"
nvidia-smi --query-gpu=index,memory.used --format=csv
echo "== 3b. dashboard + kill via keys"; $E3 --config $W/eagle3.toml launch local; wait_mem $NG
cd $W && tmux new-session -d -s d -x 160 -y 50 "$E3 connect local"; sleep 6; tmux capture-pane -p -t d > "$OUT/dashboard_gpus.txt"
tmux send-keys -t d k; sleep 1.5; tmux capture-pane -p -t d > "$OUT/dashboard_confirm.txt"
tmux capture-pane -p -t d > "$OUT/dashboard_confirm.txt"
t0=$(date +%s.%N); tmux send-keys -t d y
for i in $(seq 1 50); do tmux capture-pane -p -t d | grep -q "Killing run" && break; sleep 0.05; done; tmux capture-pane -p -t d > "$OUT/dashboard_killing.txt"
for i in $(seq 1 400); do tmux capture-pane -p -t d | grep -q "GPUs free\|NOT free" && break; sleep 0.1; done; t1=$(date +%s.%N)
echo "keypress -> banner: $(python3 -c "print(round($t1-$t0,2))") s"; tmux capture-pane -p -t d > "$OUT/dashboard_killed.txt"; head -3 "$OUT/dashboard_killed.txt"
tmux kill-session -t d; cd - >/dev/null
echo "== 4. benches"; python3 bench/bench_agent.py --seconds ${BENCH_S:-10} --procs 1000 2>&1 | tail -12
python3 bench/bench_gpu_monitors.py --seconds ${MON_S:-20} 2>&1 | tail -6
[ -n "${SKIP_HF:-}" ] && exit 0
echo "== 5. hf backend on GPU"; python3 - <<PY
from pathlib import Path
from tui.services.demo import build_demo
p = build_demo(Path("/tmp/g"), layers=16, hidden=1024, sequences=512, seq_len=512, shard_delay=0.0)
print(p.config)
PY
sed -i 's#"--shard-delay", "0.0"\]#"--shard-delay", "0.0", "--device", "cuda", "--dtype", "bfloat16", "--batch-size", "32"]#' /tmp/g/eagle3.toml; grep command /tmp/g/eagle3.toml | cut -c1-300
cd /tmp/g && tmux new-session -d -s g -x 160 -y 50 "$E3 connect local"; sleep 3; tmux send-keys -t g l
for i in $(seq 1 20); do sleep 1; tmux capture-pane -p -t g | grep -q "batch [2-9]" && break; done; tmux capture-pane -p -t g > "$OUT/dashboard_hf_gpu.txt"
for i in $(seq 1 120); do grep -q "\[extract\] done" /tmp/g/runs/*/output.log ~/.cache/eagle3-tui/runs/*/output.log 2>/dev/null && break; sleep 1; done
sleep 2; tmux capture-pane -p -t g > "$OUT/dashboard_hf_done.txt"; tmux kill-session -t g  # the screen a frame after the log says done
grep -h "\[extract\] done\|Loading weights took" /tmp/g/runs/*/output.log ~/.cache/eagle3-tui/runs/*/output.log 2>/dev/null | tail -3
