"""Checkpoints carry checksums: a damaged file (flipped byte, truncation) in any checkpoint file is never loaded
silently; the loader falls back to the previous intact checkpoint with one warning, or fails with one clean line."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest
import torch

from pretok_lib.errors import PretokError
from pretok_lib.train import checkpoint

FILES = (*checkpoint.FILES, checkpoint.CHECKSUMS)


def _model_opt(seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return model, opt


def _train_step(model, opt) -> None:
    model(torch.randn(3, 8)).pow(2).sum().backward()
    opt.step()
    opt.zero_grad()


def _state(step: int) -> dict:
    return {"scheduler": {}, "scaler": {}, "loader": {"pos": step}, "progress": {"step": step}}


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> tuple[Path, dict[int, dict]]:
    """Checkpoints of steps 1 and 2 and the model weights each holds."""
    d = tmp_path_factory.mktemp("ckpt") / "checkpoints"
    model, opt = _model_opt()
    weights = {}
    for step in (1, 2):
        _train_step(model, opt)
        checkpoint.save(d, step, model, opt, _state(step), keep=2)
        weights[step] = {k: v.clone() for k, v in model.state_dict().items()}
    return d, weights


def _damage(path: Path, rng: random.Random) -> str:
    data = bytearray(path.read_bytes())
    if rng.random() < 0.5 and data:
        i = rng.randrange(len(data))
        data[i] ^= rng.randrange(1, 256)
        how = f"flip at {i}"
    else:
        n = rng.randrange(len(data))
        data = data[:n]
        how = f"truncate to {n}"
    path.write_bytes(bytes(data))
    return how


def test_save_writes_checksums_and_load_round_trips(saved, tmp_path):
    d, weights = saved
    assert sorted(p.name for p in (d / "step_00000002").iterdir()) == sorted(FILES)
    assert checkpoint.damage(d / "step_00000002") is None
    model, opt = _model_opt(seed=1)
    path, state = checkpoint.load_newest(d, model, opt, "cpu")
    assert path.name == "step_00000002" and state["step"] == 2 and state["loader"] == {"pos": 2}
    assert all(torch.equal(v, weights[2][k]) for k, v in model.state_dict().items())
    assert checkpoint.load_newest(tmp_path / "none", model, opt, "cpu") is None


@pytest.mark.parametrize("seed", range(40))
def test_fuzz_damaged_checkpoint_falls_back_or_fails_cleanly(saved, tmp_path, seed):
    """Damage one random file of the newest checkpoint (or of both): the loaded weights are exactly those saved
    at the step it reports, after one warning per skipped checkpoint; or one clean error when none is intact."""
    rng = random.Random(seed)
    d = tmp_path / "checkpoints"
    shutil.copytree(saved[0], d)
    damaged = [2] if seed % 4 else [1, 2]
    for step in damaged:
        _damage(d / f"step_{step:08d}" / rng.choice(FILES), rng)
    model, opt = _model_opt(seed=1)
    warnings: list[str] = []
    try:
        path, state = checkpoint.load_newest(d, model, opt, "cpu", warnings.append)
    except PretokError as e:
        assert damaged == [1, 2] and "no intact checkpoint" in str(e) and "\n" not in str(e)
        assert len(warnings) == 2
        return
    step = state["step"]
    assert path.name == f"step_{step:08d}"
    # the weights in the model are exactly the ones saved at that step: nothing damaged was used
    assert all(torch.equal(v, saved[1][step][k]) for k, v in model.state_dict().items())
    if step not in damaged:
        assert step == 1 and len(warnings) == 1 and "step_00000002" in warnings[0]
    else:       # a byte flipped into equivalent JSON whitespace of checksums.json: the data is intact
        assert not warnings and checkpoint.damage(path) is None
    assert all("\n" not in w for w in warnings)


def test_failed_save_leaves_the_previous_checkpoint(saved, tmp_path, monkeypatch):
    d = tmp_path / "checkpoints"
    shutil.copytree(saved[0], d)
    model, opt = _model_opt()
    real = torch.save

    def failing(obj, f, *a, **k):
        if isinstance(obj, dict) and "rng" in obj:
            raise OSError(28, "No space left on device")
        return real(obj, f, *a, **k)

    monkeypatch.setattr(torch, "save", failing)
    with pytest.raises(OSError):
        checkpoint.save(d, 3, model, opt, _state(3), keep=2)
    assert sorted(p.name for p in d.iterdir()) == ["step_00000001", "step_00000002"]   # no temp dir left
    assert checkpoint.damage(d / "step_00000002") is None


@pytest.mark.parametrize("keep", [1, 2, 3])
def test_a_save_after_a_resume_past_a_damaged_checkpoint_keeps_what_it_wrote(tmp_path, keep):
    """Checkpoints 1, 2 and a damaged 4; the resume starts from 2 and saves 3. Pruning by step number deleted 3 (with
    keep=1) and kept the damaged 4: a kill then lost all progress. The newer checkpoint is stale, the new one kept."""
    d = tmp_path / "checkpoints"
    model, opt = _model_opt()
    for step in (1, 2, 4):
        _train_step(model, opt)
        checkpoint.save(d, step, model, opt, _state(step), keep=5)
    _damage(d / "step_00000004" / "model.pt", random.Random(0))
    path, state = checkpoint.load_newest(d, model, opt, "cpu")
    assert path.name == "step_00000002"
    checkpoint.save(d, 3, model, opt, _state(3), keep=keep)
    assert [p.name for p in checkpoint.list_checkpoints(d)] == ["step_00000001", "step_00000002",
                                                                "step_00000003"][-keep:]
    assert checkpoint.load_newest(d, model, opt, "cpu")[0].name == "step_00000003"


def _lose(path: Path, how: str) -> None:
    """A file of a checkpoint lost: deleted, or a directory where the file was (what a bad copy leaves)."""
    path.unlink()
    if how == "directory":
        path.mkdir()


LOSSES = [(name, how) for name in FILES for how in ("deleted", "directory")]


@pytest.mark.parametrize("name,how", LOSSES)
def test_a_checkpoint_that_lost_a_file_is_damaged_never_passed_over(saved, tmp_path, name, how):
    """Checkpoints listed only when all their files were there: one that lost model.pt, optim.pt or state.pt was
    skipped without a word, so a resume took the one before (or, with none left, restarted the run from step 0 and
    cut its metrics to nothing, exit 0) and `pretok export` exported an older step. A lost checksums.json made the
    checkpoint load unverified, as one from before checksums. Now each is damage: a warning and the previous one,
    one clean error when none is left, an export error naming it."""
    from pretok_lib.train.export import pick_checkpoint

    run = tmp_path / "run"
    d = run / "checkpoints"
    shutil.copytree(saved[0], d)
    _lose(d / "step_00000002" / name, how)
    assert [p.name for p in checkpoint.list_checkpoints(d)] == ["step_00000001", "step_00000002"]
    assert name in checkpoint.damage(d / "step_00000002")
    model, opt = _model_opt(seed=1)
    warnings: list[str] = []
    path, state = checkpoint.load_newest(d, model, opt, "cpu", warnings.append)
    assert path.name == "step_00000001" and state["step"] == 1
    assert all(torch.equal(v, saved[1][1][k]) for k, v in model.state_dict().items())
    assert len(warnings) == 1 and "step_00000002" in warnings[0] and name in warnings[0]
    with pytest.raises(PretokError, match=f"damaged checkpoint: {name}") as e:
        pick_checkpoint(run)
    assert "step_00000002" in str(e.value) and "--step" in str(e.value)
    _lose(d / "step_00000001" / name, how)
    with pytest.raises(PretokError, match="no intact checkpoint to resume from") as e:
        checkpoint.load_newest(d, model, opt, "cpu")
    assert "\n" not in str(e.value)


def test_a_checkpoint_from_before_checksums_still_loads_with_a_warning(saved, tmp_path):
    """What a checkpoint written before checksums.json existed looks like (no file, no mark in state.pt): loaded,
    with the `loaded unverified` warning."""
    d = tmp_path / "checkpoints"
    shutil.copytree(saved[0], d)
    newest = d / "step_00000002"
    (newest / checkpoint.CHECKSUMS).unlink()
    state = torch.load(newest / "state.pt", weights_only=False)
    del state[checkpoint.CHECKSUMMED]
    torch.save(state, newest / "state.pt")
    model, opt = _model_opt(seed=1)
    warnings: list[str] = []
    path, state = checkpoint.load_newest(d, model, opt, "cpu", warnings.append)
    assert path == newest and state["step"] == 2 and len(warnings) == 1 and "loaded unverified" in warnings[0]


def test_an_empty_checkpoint_directory_is_damaged(saved, tmp_path):
    d = tmp_path / "checkpoints"
    shutil.copytree(saved[0], d)
    (d / "step_00000003").mkdir()
    warnings: list[str] = []
    path, _ = checkpoint.load_newest(d, *_model_opt(seed=1), "cpu", warnings.append)
    assert path.name == "step_00000002" and len(warnings) == 1 and "model.pt is missing" in warnings[0]
