"""The patch engine (tui/state/patches.py) and the bundled set, on the real wheel's files."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests import spec_wheel
from tui.state import patches as P
from tui.state.loganalysis.signatures import load_signatures

SET = "speculators-0.3.0-vllm-0.16"
GEN = "data_generation/vllm_hidden_states_generator.py"
WORKER = "data_generation/custom_worker.py"


@pytest.fixture(scope="module")
def pset() -> P.PatchSet:
    return P.load_set(SET, user_dir=Path("/nonexistent-user-dir"))


@pytest.fixture(scope="module")
def pristine() -> dict[str, bytes]:
    return spec_wheel.pristine_files()


def shas(files: dict[str, bytes]) -> dict[str, str]:
    return {p: P.sha256(b) for p, b in files.items()}


def test_manifest_pristine_hashes_are_the_wheels(pset: P.PatchSet, pristine: dict[str, bytes]) -> None:
    assert (pset.distribution, pset.version, pset.package) == ("speculators", "0.3.0", "speculators")
    assert dict(pset.files) == shas(pristine)


def test_every_version_applies_compiles_and_matches_its_hashes(
        pset: P.PatchSet, pristine: dict[str, bytes]) -> None:
    assert P.version_order(pset) == ["v1", "v2", "v3", "v4", "v5"]
    assert P.latest(pset).name == "v5" and "complete fix" in P.latest(pset).title
    seen = {tuple(sorted(shas(pristine).items()))}
    for v in pset.versions:
        built = P.build_version(pset, v.name, pristine)
        for path, data in built.items():
            compile(data, f"speculators/{path}", "exec")
        assert P.version_hashes(pset, v, pristine) == P.version_hashes(pset, v)  # manifest sha256
        state = tuple(sorted(shas(built).items()))
        assert state not in seen  # every version is a distinct state
        seen.add(state)
    final = P.build_version(pset, "latest", pristine)
    assert b"get_input_embeddings" not in final[WORKER]
    assert b"captured_states_list[0]" not in final[GEN]
    assert b"self.executor.sample_tokens(None)" in final[GEN]


def test_versions_are_cumulative_and_cover_every_signature_once(pset: P.PatchSet) -> None:
    fixes = [f for v in pset.versions for f in v.fixes]
    assert sorted(fixes) == sorted({
        "sample-tokens-state", "tensor-bool-ambiguous", "block-hasher-assert",
        "scheduler-config-encoder-decoder", "kv-cache-specs-typeerror", "scheduler-block-size",
        "get-input-embeddings"})


def test_signatures_point_at_the_first_version_with_the_fix(pset: P.PatchSet) -> None:
    """tui/data/signatures.toml names, per failure, the first version that fixes it."""
    first = {f: v.name for v in reversed(pset.versions) for f in v.fixes}
    for sig in load_signatures(user_file=None):
        fix = sig.fix if isinstance(sig.fix, dict) else {}
        if fix.get("patch") == SET:
            assert fix.get("version") == first[sig.id], (sig.id, fix)


def test_strict_applier_rejects_a_changed_context_line(pset: P.PatchSet,
                                                       pristine: dict[str, bytes]) -> None:
    edited = pristine[GEN].replace(b"            block_size=VLLM_BLOCK_SIZE,",
                                   b"            block_size=VLLM_BLOCK_SIZE,  # hand edit")
    with pytest.raises(P.PatchError, match=rf"^{GEN}: hunk 3 \(at line 166\) does not match"):
        P.apply_diff(edited, P.latest(pset).diff, GEN)


def test_strict_applier_refuses_shifted_lines(pset: P.PatchSet, pristine: dict[str, bytes]) -> None:
    # GNU patch would find every hunk one line lower and apply it; we must not.
    shifted = b"# one extra line\n" + pristine[GEN]
    with pytest.raises(P.PatchError, match="hunk 1 .* does not match"):
        P.apply_diff(shifted, P.latest(pset).diff, GEN)


def test_applier_rejects_malformed_hunks() -> None:
    bad_counts = "--- a/f.py\n+++ b/f.py\n@@ -1,2 +1,2 @@\n-a\n+b\n"
    with pytest.raises(P.PatchError, match="line counts"):
        P.apply_diff(b"a\nx\n", bad_counts, "f.py")
    assert P.apply_diff(b"a\n", bad_counts, "other.py") == b"a\n"  # not in the diff


lines = st.lists(st.sampled_from(["a\n", "b\n", "c\n", "", "d", "e\x0cf\n", "g\r\n", "\xe9\n"]),
                 max_size=12).map(
    lambda xs: "".join(xs).encode())


@settings(max_examples=300, deadline=None)
@given(before=lines, after=lines)
def test_captured_diff_applies_back_exactly(before: bytes, after: bytes) -> None:
    diff = P.make_version_diff(before, after, "x.py")
    assert P.apply_diff(before, diff, "x.py") == after


def test_classify(pset: P.PatchSet, pristine: dict[str, bytes]) -> None:
    assert P.classify(pset, shas(pristine)) == P.PRISTINE
    for v in pset.versions:
        built = shas(P.build_version(pset, v.name, pristine))
        assert P.classify(pset, built) == v.name
        assert P.classify(pset, built, pristine) == v.name
    mixed = {**shas(P.build_version(pset, "v5", pristine)), WORKER: pset.files[WORKER]}
    assert P.classify(pset, mixed) == P.UNKNOWN
    assert P.classify(pset, {**shas(pristine), GEN: P.sha256(pristine[GEN] + b"#\n")}) == P.UNKNOWN
    assert P.classify(pset, {**shas(pristine), WORKER: None}) == P.MISSING
    # v3..v5 share custom_worker.py; v1/v2 leave it pristine.
    v5_worker = P.sha256(P.build_version(pset, "v5", pristine)[WORKER])
    assert P.file_states(pset, WORKER, v5_worker) == ["v3", "v4", "v5"]
    assert P.file_states(pset, WORKER, pset.files[WORKER]) == ["pristine", "v1", "v2"]


def test_capture_round_trips_through_a_user_copy(tmp_path: Path, pset: P.PatchSet,
                                                 pristine: dict[str, bytes]) -> None:
    v5 = P.build_version(pset, "v5", pristine)
    edited = {**v5, GEN: v5[GEN].replace(b"MAX_NUM_SEQS = 32", b"MAX_NUM_SEQS = 64")}
    diff = "".join(P.make_version_diff(pristine[p], edited[p], p) for p in pset.files)
    new = P.PatchVersion(name="v6", title='max_num_seqs 64 "tuned"', diff=diff,
                         diff_file="v6.diff", fixes=(), notes="line one\nline two",
                         sha256={p: P.sha256(b) for p, b in edited.items()})
    user = tmp_path / "user"
    (user / SET).mkdir(parents=True)
    for v in pset.versions:
        (user / SET / v.diff_file).write_text(v.diff)
    (user / SET / "v6.diff").write_text(diff)
    (user / SET / "manifest.toml").write_text(P.render_manifest(P.with_version(pset, new)))
    again = P.load_set(SET, user_dir=user)
    assert again.user and P.version_order(again)[-1] == "v6"
    assert again.versions[-1].title == new.title and again.versions[-1].notes == new.notes
    assert P.build_version(again, "v6", pristine) == edited
    assert P.classify(again, shas(edited)) == "v6"
    assert P.build_version(again, "v5", pristine) == v5
    with pytest.raises(P.PatchError, match="taken"):
        P.with_version(again, new)


@pytest.mark.parametrize("text,key", [
    ("[target]\nversion = '0.3.0'\npackage = 'x'\nfiles = {}\n", "'files'"),
    ("[target]\ndistribution = 'x'\nversion = '1'\npackage = 'x'\n"
     "files = { 'a.py' = '" + "0" * 64 + "' }\n[[versions]]\nname = 'v1'\ndiff = 'v1.diff'\n",
     "'title'"),
    ("[target\n", "manifest.toml"),
    ("[target]\ndistribution = 'x'\nversion = '1'\npackage = 'x'\n"
     "files = { 'a.py' = '" + "0" * 64 + "' }\n[[versions]]\nname = 'pristine'\n", "'name'"),
])
def test_malformed_manifest_is_one_line_naming_file_and_key(tmp_path: Path, text: str,
                                                            key: str) -> None:
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "manifest.toml").write_text(text)
    with pytest.raises(P.PatchError) as info:
        P.load_set("bad", user_dir=tmp_path)
    msg = str(info.value)
    assert "\n" not in msg and "manifest.toml" in msg and key in msg


def test_set_lookup(tmp_path: Path) -> None:
    assert (P.bundled_sets_dir() / SET / "manifest.toml").is_file()
    assert SET in P.list_sets(user_dir=tmp_path)
    with pytest.raises(P.PatchError, match="no patch set named 'nope'"):
        P.load_set("nope", user_dir=tmp_path)
    with pytest.raises(P.PatchError, match="bad patch set name"):
        P.load_set("../etc", user_dir=tmp_path)
    assert P.user_sets_dir().name == "patches"
