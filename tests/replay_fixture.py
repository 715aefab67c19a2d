"""A recorded run dir for the replay tests, made by the host's own Recorder
(remote/run/timeline.py) on a fake clock, with the log written in step: a run of the
same command loaded in 50 s before (``expected_load_s``), 16 shards in 80 s, then 40
batches on four of eight cards, and an exit 0 at 171 s. Its log carries host text
that must stay data: an escape that would retitle the terminal, and Rich markup."""

from __future__ import annotations

import json
from pathlib import Path

from remote.run import timeline as hosttl

T0 = 1_764_460_000.0
RUN_ID = "20261130-015500-ab12"


def record(run_dir: Path) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "manifest.json").write_text(json.dumps({
        "run_id": RUN_ID, "name": "kimi-extract", "argv": ["python", "extract.py", "--model", "/m/kimi"],
        "cwd": "/srv", "env": {}, "host": "gpu-box", "pid": 4242, "launched_at": T0 - 1.0,
        "start_time": T0, "expected_load_s": 50.0, "expected_load_runs": ["20261129-015500-0001"],
        "log": "/srv/runs/%s/output.log" % RUN_ID}))
    rec = hosttl.Recorder(str(run_dir), T0, RUN_ID, launched_at=T0 - 1.0, sample_s=5.0)
    log = (run_dir / "output.log").open("wb")
    size = 0

    def say(line: str) -> None:
        nonlocal size
        data = (line + "\n").encode()
        log.write(data)
        size += len(data)

    say("INFO 11-30 02:00:00 [loader.py:1] Starting to load model /m/kimi...")
    say("\x1b]0;pwned\x07\x1b[31m[red]not markup[/red]\x1b[0m host text stays text")
    batch = 0
    for tick in range(0, 172):
        now = T0 + tick
        if 2 <= tick <= 82 and tick % 5 == 2:
            n = (tick - 2) // 5
            say("Loading safetensors checkpoint shards: %3d%% Completed | %d/16 [00:%02d<%02d:%02d, 5.00s/it]"
                % (n * 100 // 16, n, n * 5, (16 - n) * 5 // 60, (16 - n) * 5 % 60))
        if tick == 83:
            say("INFO Model loading took 120.5 GiB and 81.0 seconds")
        if 85 <= tick < 165 and tick % 2 == 1:
            batch += 1
            say("[extract] batch %d/40 | seqs %d/320 | tokens %d/81920 | 1024.0 tok/s"
                " | elapsed 0:01:%02d | eta 0:00:%02d"
                % (batch, batch * 8, batch * 2048, batch % 60, 40 - batch))
        if tick == 166:
            say("[extract] done: 320 sequences, 81920 tokens in 0:01:20 (1024.0 tok/s) -> /srv/out")
        log.flush()
        phase = ("starting" if tick < 2 else "loading" if tick < 83 else "loaded" if tick < 85
                 else "extracting" if tick < 166 else "finished")
        step = ["shard", min(16, max(0, (tick - 2) // 5)), 16] if phase == "loading" else ["batch", batch]
        held = phase in ("loaded", "extracting")
        gpus = [{"index": i, "mem_used": (70 if held and i < 4 else 1) * 2 ** 30,
                 "util": (88 if held and i < 4 else 0), "power": 600 if held and i < 4 else 70,
                 "processes": [{"pid": 4242}] if held and i < 4 else []} for i in range(8)]
        rec.look(now, phase, "%s %s" % (step[0], step[1]), step, None, gpus if rec.sample_due(now) else None,
                 [4242], offset=size)
    rec.event(T0 + 171, "exit", code=0, signal=None)
    rec.close()
    log.close()
    (run_dir / "exit.json").write_text(json.dumps({"exit_code": 0, "signal": None, "ended_at": T0 + 171}))
    return run_dir


if __name__ == "__main__":  # a run dir to try `eagle3-tui replay` on
    import sys

    print(record(Path(sys.argv[1])))
