"""The on-the-fly baselines tokenize as `pretok tokenize` does with the same `--bos/--eos/--separator`
(`data.bos`, `data.eos`, `data.separator`): padded == pretok-padded and padding-free == pretok-memmap, batch for
batch, under every policy and on generated text files, so the study compares the same token streams whatever BOS/EOS
it was given. A policy the tokenizer cannot meet is refused as by the engine."""

from __future__ import annotations

import numpy as np
import pytest

from pretok_lib.data import make_dataset
from pretok_lib.errors import PretokError
from pretok_lib.pretokenize import TokenizeConfig, run_tokenize
from pretok_lib.train.config import load_config

from ..tokenizer.test_specials import tiny_bpe
from .helpers import content, run

POLICIES = [("auto", "no"), ("no", "no"), ("yes", "yes"), ("no", "yes"), ("yes", "no")]
SEPARATOR = r"\n\s*\n"


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return tiny_bpe(tmp_path_factory.mktemp("ptok") / "tokenizer.json")


def _text(seed: int) -> str:
    """Documents of 1-60 words joined by blank lines of varied shape (1-3 empty lines, trailing spaces)."""
    rng = np.random.default_rng(seed)
    words = ["alpha", "beta", "gamma", "delta", "the", "a", "of", "\u00e9t\u00e9", "x1"]
    docs = [" ".join(rng.choice(words, rng.integers(1, 60))) for _ in range(rng.integers(12, 30))]
    seps = ["\n\n", "\n\n\n", "\n \n", "\n\n\n\n"]
    return "".join(d + seps[int(rng.integers(len(seps)))] for d in docs)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("bos,eos", POLICIES)
def test_on_the_fly_paths_tokenize_as_pretok_tokenize_with_the_same_policy(tok, tmp_path, bos, eos, seed):
    txt = tmp_path / "book.txt"
    txt.write_text(_text(seed))
    seq_len = 24
    for fmt in ("padded", "memmap"):
        run_tokenize(TokenizeConfig(inputs=[str(txt)], out=str(tmp_path / fmt), tokenizer=str(tok), format=fmt,
                                    seq_len=seq_len, bos=bos, eos=eos, separator=SEPARATOR, workers=0,
                                    progress=False))

    def batches(kind, path):
        kw = {"tokenizer": str(tok), "bos": bos, "eos": eos, "separator": SEPARATOR} if "pretok" not in kind else {}
        return run(make_dataset(kind, path, seq_len, micro_batch=2, rank=0, world=1, seed=5, doc_aware=True, **kw))[1]

    for fly, pre in (("padded", "pretok-padded"), ("padding-free", "pretok-memmap")):
        a, b = batches(fly, [str(txt)]), batches(pre, str(tmp_path / pre.removeprefix("pretok-")))
        assert len(a) == len(b) > 0
        assert all(content(x) == content(y) for x, y in zip(a, b)), (fly, pre)
    first = batches("padded", [str(txt)])[0]["input_ids"][:, 0].tolist()
    assert all(i == 0 for i in first) == (bos != "no")        # <s> (id 0) begins each row, or does not


def test_a_policy_the_tokenizer_cannot_meet_is_refused_as_by_the_engine(tmp_path):
    plain = tiny_bpe(tmp_path / "t" / "tokenizer.json", specials=())
    (tmp_path / "d.txt").write_text("one\n\ntwo\n")
    for role in ("bos", "eos"):
        with pytest.raises(PretokError, match=f"--{role} yes, but tokenizer .* defines no {role.upper()} token"):
            make_dataset("padded", [str(tmp_path / "d.txt")], 8, tokenizer=str(plain), **{role: "yes"})


@pytest.mark.parametrize("given,want", [("yes", "yes"), ("no", "no"), ('"no"', "no")])
def test_config_takes_yaml_yes_and_no_for_bos_and_eos(given, want):
    cfg = load_config(None, ["data.path=x", f"data.bos={given}", f"data.eos={given}"])
    assert (cfg.data.bos, cfg.data.eos) == (want, want)
    with pytest.raises(PretokError, match="data.bos 'maybe'"):
        load_config(None, ["data.path=x", "data.bos=maybe"])
