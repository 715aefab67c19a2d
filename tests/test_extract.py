"""remote/extract.py, run for real as a subprocess on a tiny demo model (hf backend, CPU)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import need

try:
    import safetensors.torch  # noqa: F401
    import torch
    import transformers  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    need.missing(f"needs torch, transformers, safetensors ({exc}): pip install 'eagle3-tui[demo]'")

from tui.services.demo import build_demo

ROOT = Path(__file__).resolve().parent.parent
EXTRACT = ROOT / "remote" / "extract.py"

BAR = re.compile(
    r"^Loading safetensors checkpoint shards: (?P<pct>[ \d]{2}\d)% Completed \| "
    r"(?P<n>\d+)/(?P<total>\d+) \[(?P<el>\d{2}:\d{2}|\d+:\d{2}:\d{2})<"
    r"(?P<rem>\?|\d{2}:\d{2}|\d+:\d{2}:\d{2}), (?P<rate>\?it/s|\s*\d+\.\d{2}(?:it/s|s/it))\]$"
)
PROGRESS = re.compile(
    r"^\[extract\] batch (\d+)/(\d+) \| seqs (\d+)/(\d+) \| tokens (\d+)/(\d+) \| "
    r"(\d+\.\d) tok/s \| elapsed \d+:\d{2}:\d{2} \| eta \d+:\d{2}:\d{2}$"
)
SKIPPED = re.compile(r"^\[extract\] batch (\d+)/(\d+) skipped \(already done\)$")
DONE = re.compile(
    r"^\[extract\] done: (\d+) sequences, (\d+) tokens in \d+:\d{2}:\d{2} "
    r"\((\d+\.\d) tok/s\) -> (/.+/data_config\.json)$"
)
KEYS = ["input_ids", "hidden_states", "loss_mask"]


def extract(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(EXTRACT), *args], capture_output=True,
                          text=True, timeout=timeout)


def load_sample(path: Path) -> dict:
    """As speculators 0.3.0's Eagle3SampleFileDataset loads each file."""
    return torch.load(str(path), mmap=True, weights_only=True, map_location="cpu")


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory):
    """An 8-layer model in 6 shards, and a dataset of unequal lengths (padding matters)."""
    paths = build_demo(tmp_path_factory.mktemp("demo"), shards=6, layers=8, hidden=64,
                       sequences=2, seq_len=8, shard_delay=0.0, patches=False)
    data = paths.root / "varied.jsonl"
    lengths = [5, 17, 9, 33, 2, 12, 21, 7, 14, 3]
    with open(data, "w") as f:
        for i, n in enumerate(lengths):
            ids = [(7 * i + 13 * t) % 1000 + 3 for t in range(n)]
            f.write(json.dumps({"input_ids": ids}) + "\n")
    return paths, data, lengths


@pytest.fixture(scope="module")
def first_run(demo, tmp_path_factory: pytest.TempPathFactory):
    paths, data, _ = demo
    out = tmp_path_factory.mktemp("out")
    proc = extract("--backend", "hf", "--model", str(paths.model), "--data", str(data),
                   "--out", str(out), "--batch-size", "4", "--device", "cpu")
    assert proc.returncode == 0, proc.stderr
    return out, proc


def test_speculators_files_and_config(demo, first_run) -> None:
    _, data, lengths = demo
    out, _ = first_run
    # Nothing else whose name ends in "pt": speculators' list_files takes all of those.
    assert sorted(p.name for p in out.iterdir() if p.name.endswith("pt")) == sorted(
        f"data_{i}.pt" for i in range(len(lengths)))
    rows = [json.loads(line)["input_ids"] for line in data.read_text().splitlines()]
    for i, n in enumerate(lengths):
        d = load_sample(out / f"data_{i}.pt")
        assert list(d) == KEYS
        assert d["input_ids"].dtype == torch.int64 and d["input_ids"].tolist() == rows[i]
        assert d["loss_mask"].dtype == torch.int64 and d["loss_mask"].tolist() == [1] * n
        hs = d["hidden_states"]
        assert isinstance(hs, list) and len(hs) == 4
        for h in hs:
            assert h.dtype == torch.float32 and h.shape == (n, 64)
            # each on its own storage: the loader estimates lengths from file sizes
            assert h.untyped_storage().nbytes() == n * 64 * 4
    config = json.loads((out / "data_config.json").read_text())
    # speculators' default for 8 layers: [2, 8 // 2, 8 - 3, 8 - 1]
    assert config["hidden_states"]["layer_ids"] == [2, 4, 5, 7]
    assert config["hidden_states"]["trainable"] is True
    assert config["model"]["hidden_size"] == 64 and config["model"]["num_hidden_layers"] == 8
    assert config["data"]["num_samples"] == len(lengths)
    assert config["data"]["num_tokens"] == sum(lengths)
    assert config["format"]["file_pattern"] == "data_{idx}.pt"
    assert config["format"]["data_format_version"] == 1
    freq = torch.load(str(out / config["token_freq"]["file"]), weights_only=True)
    want: dict[int, int] = {}
    for r in rows:
        for t in r:
            want[t] = want.get(t, 0) + 1
    assert freq == want and list(freq) == sorted(want)
    assert config["token_freq"] == {"file": "token_freq.pth", "masked_tokens": sum(lengths)}


def test_matches_direct_forward(demo, first_run) -> None:
    """Each captured layer equals transformers' own forward of that sequence alone."""
    paths, _, lengths = demo
    out, _ = first_run
    model = transformers.AutoModelForCausalLM.from_pretrained(str(paths.model)).float()
    model.eval()
    layers = [2, 4, 5, 7]
    for i in range(len(lengths)):
        d = load_sample(out / f"data_{i}.pt")
        with torch.no_grad():
            ref = model(d["input_ids"][None], output_hidden_states=True).hidden_states
        for k, layer in enumerate(layers):
            ours = d["hidden_states"][k]
            if layer == 7:
                # hidden_states[-1] is after the final norm; ours is before it, as
                # speculators captures it.
                ours = model.model.norm(ours[None])[0]
                assert torch.allclose(ours, ref[-1][0], atol=1e-4, rtol=1e-4)
            else:
                assert torch.allclose(ours, ref[layer + 1][0], atol=1e-4, rtol=1e-4)


def test_log_lines_parse(demo, first_run) -> None:
    _, _, lengths = demo
    out, proc = first_run
    bars = [BAR.match(line) for line in proc.stderr.splitlines() if "checkpoint shards" in line]
    assert all(bars), proc.stderr
    assert [int(m["n"]) for m in bars] == list(range(0, 7))
    assert {int(m["total"]) for m in bars} == {6}
    assert int(bars[-1]["pct"]) == 100 and bars[-1]["rem"] == "00:00"
    assert int(bars[3]["pct"]) == 50
    assert re.search(r"^Loading weights took \d+\.\d\d seconds$", proc.stderr, re.M)
    waited = re.search(r"^\[extract\] waited (\d+\.\d\d) s for the output writers before a "
                       r"forward, (\d+\.\d\d) s after the last one \(of (\d+\.\d\d) s\)$",
                       proc.stderr, re.M)
    assert waited and float(waited[1]) + float(waited[2]) <= float(waited[3]) + 0.02, proc.stderr
    lines = proc.stdout.splitlines()
    progress = [PROGRESS.match(line) for line in lines[:-1]]
    assert all(progress), proc.stdout
    # By length, longest first, each batch as many as fit 4 x 33 padded tokens:
    # 33 21 17 14 | 12 9 7 5 3 2 (6 x 12 = 72).
    assert [(m[1], m[2], m[3], m[5]) for m in progress] == [
        ("1", "2", "4", "85"), ("2", "2", "10", "123")]
    done = DONE.match(lines[-1])
    assert done and done[1] == "10" and done[2] == str(sum(lengths))
    assert Path(done[4]) == out / "data_config.json"


def _digests(d: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())}


def test_killed_and_resumed_is_byte_identical(demo, first_run, tmp_path: Path) -> None:
    paths, data, lengths = demo
    args = ["--backend", "hf", "--model", str(paths.model), "--data", str(data),
            "--batch-size", "1", "--device", "cpu"]
    full, part = tmp_path / "full", tmp_path / "part"
    # The uninterrupted reference runs alongside the run that gets killed.
    ref = subprocess.Popen([sys.executable, str(EXTRACT), *args, "--out", str(full)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    proc = subprocess.Popen([sys.executable, str(EXTRACT), *args, "--out", str(part)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (part.exists() and list(part.glob("data_*.pt"))):
            assert proc.poll() is None, "extract.py ended before writing its first file"
            assert time.monotonic() < deadline, "no data file within 60 s"
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
        _, ref_err = ref.communicate(timeout=120)
    assert ref.returncode == 0, ref_err
    assert proc.returncode == -signal.SIGKILL
    assert not (part / "data_config.json").exists(), "the run finished before the kill"
    kept = {int(p.name[5:-3]) for p in part.glob("data_*.pt")}
    assert 0 < len(kept) < len(lengths)
    resumed = extract(*args, "--out", str(part))
    assert resumed.returncode == 0, resumed.stderr
    skipped = [SKIPPED.match(line) for line in resumed.stdout.splitlines()]
    # batch size 1 (33 padded tokens a batch), longest first: 33 | 21 | 17 | 14 12 |
    # 9 7 5 | 3 2; a batch is skipped when all its files are there
    batches = [[3], [6], [1], [8, 5], [2, 7, 0], [9, 4]]
    assert {int(m[2]) for m in skipped if m} == {len(batches)}
    assert {int(m[1]) for m in skipped if m} == {
        b for b, idx in enumerate(batches, 1) if set(idx) <= kept}
    assert _digests(part) == _digests(full)
    # data files, token_freq.pth, data_config.json, the lock file; no temp file left
    assert len(_digests(full)) == len(lengths) + 3


def test_rerun_redoes_a_damaged_file_only(demo, first_run, tmp_path: Path) -> None:
    paths, data, lengths = demo
    out, _ = first_run
    copy = tmp_path / "out"
    copy.mkdir()
    for p in out.iterdir():
        (copy / p.name).write_bytes(p.read_bytes())
    before = _digests(copy)
    (copy / "data_3.pt").write_bytes((copy / "data_3.pt").read_bytes()[:100])  # torn
    (copy / "data_5.tmp-999").write_bytes(b"left by a killed run")
    proc = extract("--backend", "hf", "--model", str(paths.model), "--data", str(data),
                   "--out", str(copy), "--batch-size", "4", "--device", "cpu")
    assert proc.returncode == 0, proc.stderr
    # data_3 (33 tokens) is in batch 1; batch 2 (six sequences) is skipped
    assert [SKIPPED.match(x)[1] for x in proc.stdout.splitlines() if SKIPPED.match(x)] == ["2"]
    assert _digests(copy) == before


@pytest.mark.parametrize("layers", [None, "2,4,7", "1,2,3,4", "1,2,3,5,7"])
def test_layers_that_cannot_train_are_refused_unless_raw(tmp_path: Path, layers: str | None) -> None:
    paths = build_demo(tmp_path / "demo", shards=2, layers=5 if layers is None else 8,
                       hidden=32, sequences=3, seq_len=6, shard_delay=0.0, patches=False)
    args = ["--model", str(paths.model), "--data", str(paths.data), "--device", "cpu"]
    args += ["--layers", layers] if layers else []
    proc = extract(*args, "--out", str(tmp_path / "out"))
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "cannot train an EAGLE-3 drafter" in proc.stderr and "--raw" in proc.stderr
    if layers is None:
        assert "default layers [2, 2, 2, 4]" in proc.stderr
    assert not list((tmp_path / "out").glob("*pt"))
    raw = extract(*args, "--raw", "--out", str(tmp_path / "raw"))
    assert raw.returncode == 0, raw.stderr
    want = sorted({2, 4}) if layers is None else sorted(int(x) for x in layers.split(","))
    config = json.loads((tmp_path / "raw" / "data_config.json").read_text())
    assert config["hidden_states"]["layer_ids"] == want
    assert config["hidden_states"]["trainable"] is False
    assert len(load_sample(tmp_path / "raw" / "data_0.pt")["hidden_states"]) == len(want)


@pytest.mark.parametrize("case", ["no_model", "bad_json", "no_keys", "big_id", "empty",
                                  "bad_layers", "no_data_arg", "empty_ids", "no_writers"])
def test_bad_input_is_one_line_exit_2(demo, tmp_path: Path, case: str) -> None:
    paths, data, _ = demo
    bad = tmp_path / "bad.jsonl"
    lines = {"bad_json": ['{"input_ids": [1, 2]}', '{"input_ids": [3]}', "{not json"],
             "no_keys": ['{"input_ids": [1]}', '{"prompt": "x"}'],
             "big_id": ['{"input_ids": [1, 5000]}'],
             "empty": [],
             "empty_ids": ['{"input_ids": []}']}.get(case, ['{"input_ids": [1]}'])
    bad.write_text("".join(line + "\n" for line in lines))
    args = ["--backend", "hf", "--model", str(paths.model), "--data", str(bad),
            "--out", str(tmp_path / "out")]
    expect = {"no_model": "model directory not found",
              "bad_json": "bad.jsonl line 3: not valid JSON",
              "no_keys": "bad.jsonl line 2: needs one of",
              "big_id": "token id 5000 >= vocab size 1024",
              "empty": "no sequences", "bad_layers": "--layers: 9 is out of range [0, 7]",
              "no_data_arg": "--data is required",
              "empty_ids": "line 1: 'input_ids' must be a non-empty",
              "no_writers": "--writers must be at least 1"}
    if case == "no_model":
        args[3] = str(tmp_path / "nope")
    if case == "bad_layers":
        args += ["--layers", "1,9"]
    if case == "no_data_arg":
        del args[4:6]
    if case == "no_writers":
        args += ["--writers", "0"]
    proc = extract(*args)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert expect[case] in proc.stderr
    assert not (tmp_path / "out" / "data_config.json").exists()


def test_text_and_chat_with_loss_mask(demo, tmp_path: Path) -> None:
    """Text and chat lines go through the model's tokenizer; assistant tokens get mask 1."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    paths, _, _ = demo
    words = ["<unk>", "<s>", "</s>", "<|user|>", "<|assistant|>", "hello", "there", "how",
             "are", "you", "fine", "thanks"]
    tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>")
    fast.chat_template = (
        "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
        "{% if add_generation_prompt %}<|assistant|> {% endif %}")
    model = tmp_path / "model"
    model.mkdir()
    for f in paths.model.iterdir():
        (model / f.name).symlink_to(f)
    fast.save_pretrained(str(model))
    data = tmp_path / "chat.jsonl"
    data.write_text(
        json.dumps({"text": "hello there"}) + "\n"
        + json.dumps({"messages": [{"role": "user", "content": "how are you"},
                                   {"role": "assistant", "content": "fine thanks"}]}) + "\n"
        + json.dumps({"conversations": [{"from": "human", "value": "hello"},
                                        {"from": "gpt", "value": "hello there"},
                                        {"from": "human", "value": "thanks"}]}) + "\n")
    proc = extract("--model", str(model), "--data", str(data), "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    d = [load_sample(tmp_path / "out" / f"data_{i}.pt") for i in range(3)]
    ids = [t for x in d for t in x["input_ids"].tolist()]
    mask = [m for x in d for m in x["loss_mask"].tolist()]
    assert [len(x["input_ids"]) for x in d] == [2, 7, 7]
    assert [words[i] for i in ids[:2]] == ["hello", "there"] and mask[:2] == [1, 1]
    # <|user|> how are you <|assistant|> | fine thanks
    assert mask[2:9] == [0, 0, 0, 0, 0, 1, 1]
    # <|user|> hello <|assistant|> | hello there | <|user|> thanks
    assert mask[9:] == [0, 0, 0, 1, 1, 0, 0]
    # token frequencies count the masked tokens only: hello there, fine thanks, hello there
    freq = torch.load(str(tmp_path / "out" / "token_freq.pth"), weights_only=True)
    assert {words[t]: c for t, c in freq.items()} == {"hello": 2, "there": 2, "fine": 1,
                                                       "thanks": 1}


def test_preflight_without_vllm_fails_fast(tmp_path: Path) -> None:
    gen = tmp_path / "gen.py"
    gen.write_text("x = 1\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))  # no vllm on this machine's path
    proc = subprocess.run([sys.executable, str(EXTRACT), "--preflight",
                           "--generator-file", str(gen)],
                          capture_output=True, text=True, timeout=60, env=env)
    if "[preflight] ok import vllm" in proc.stdout:
        pytest.skip("vllm is installed here; the real-vLLM tier covers preflight")
    assert proc.returncode == 1
    assert re.search(r"^\[preflight\] FAIL import vllm: ", proc.stdout, re.M), proc.stdout
    assert proc.stdout.splitlines()[-1].startswith("[preflight] FAILED 1 check(s): import vllm")


def test_rerun_redoes_a_filled_batch_only(demo, first_run, tmp_path: Path) -> None:
    """A batch of more than --batch-size short sequences (filled to the first batch's
    padded size) missing one file is redone whole, the same bytes; the other skipped."""
    paths, data, lengths = demo
    out, _ = first_run
    copy = tmp_path / "out"
    copy.mkdir()
    for p in out.iterdir():
        (copy / p.name).write_bytes(p.read_bytes())
    before = _digests(copy)
    (copy / "data_9.pt").unlink()  # 3 tokens: batch 2, six sequences (see test_log_lines_parse)
    proc = extract("--backend", "hf", "--model", str(paths.model), "--data", str(data),
                   "--out", str(copy), "--batch-size", "4", "--device", "cpu")
    assert proc.returncode == 0, proc.stderr
    assert [SKIPPED.match(x)[1] for x in proc.stdout.splitlines() if SKIPPED.match(x)] == ["1"]
    assert [m[3] for m in map(PROGRESS.match, proc.stdout.splitlines()) if m] == ["10"]
    assert _digests(copy) == before


def test_files_follow_the_input_order_not_the_batches(demo, first_run, tmp_path: Path) -> None:
    """The same sequences in another input order: data_{i}.pt is the i-th input line's,
    with the very tensors that sequence got in the first order (no two lengths are equal,
    so each sequence gets the same batch and padding in both runs). Not the same bytes:
    torch.save names the archive's records after the file (data_7/...)."""
    paths, data, lengths = demo
    out, _ = first_run
    rows = data.read_text().splitlines()
    perm = [7, 2, 9, 0, 4, 8, 1, 6, 3, 5]  # line k of the new input is line perm[k]
    shuffled = tmp_path / "shuffled.jsonl"
    shuffled.write_text("".join(rows[i] + "\n" for i in perm))
    proc = extract("--backend", "hf", "--model", str(paths.model), "--data", str(shuffled),
                   "--out", str(tmp_path / "out"), "--batch-size", "4", "--device", "cpu")
    assert proc.returncode == 0, proc.stderr
    for k, i in enumerate(perm):
        got = load_sample(tmp_path / "out" / f"data_{k}.pt")
        want = load_sample(out / f"data_{i}.pt")
        assert got["input_ids"].tolist() == json.loads(rows[i])["input_ids"]
        assert torch.equal(got["loss_mask"], want["loss_mask"])
        for g, w in zip(got["hidden_states"], want["hidden_states"], strict=True):
            assert torch.equal(g, w), (k, i)
