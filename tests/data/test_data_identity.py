"""A loader state and a mixture know which data they hold, not only its size: `manifest.data_identity` for the
pretokenized outputs, a hash of the documents for the on-the-fly baselines.

The fault: another dataset of the same size (the same documents in another order: the same number of samples
in every format), opened with the same seed and seq_len. Its state was accepted before. The same data tokenized
again (a new manifest) or copied elsewhere must still resume, and must not enter one mixture twice."""

from __future__ import annotations

import shutil

import pyarrow.parquet as pq
import pytest

from pretok_lib.data import ShardedBatches, make_dataset, make_loader, open_mixture
from pretok_lib.errors import PretokError
from pretok_lib.formats.manifest import data_identity, read_manifest

from ..conftest import GPT2_JSON
from .conftest import _pretokenize
from .helpers import Corpus

SEQ = 32
KINDS = ["pretok-memmap", "pretok-token-list", "pretok-padded", "padded", "padding-free"]


@pytest.fixture(scope="module")
def variants(wiki, tmp_path_factory) -> dict[str, Corpus]:
    """reordered: the wiki documents reversed (other data, same sizes); again: the same file tokenized again into
    new outputs; copy: the wiki outputs and text copied elsewhere."""
    base = tmp_path_factory.mktemp("identity")
    (base / "reordered").mkdir()
    table = pq.read_table(wiki.text)
    pq.write_table(table.take(list(range(table.num_rows))[::-1]), base / "reordered" / "wiki.parquet",
                   row_group_size=100)
    (base / "again").mkdir()
    shutil.copy(wiki.text, base / "again" / "wiki.parquet")
    copy = base / "copy"
    copy.mkdir()
    shutil.copy(wiki.text, copy / "wiki.parquet")
    dirs = {k: shutil.copytree(d, copy / d.name) for k, d in wiki.dirs.items()}
    return {"reordered": _pretokenize("reordered", base / "reordered" / "wiki.parquet", base / "reordered"),
            "again": _pretokenize("again", base / "again" / "wiki.parquet", base / "again"),
            "copy": Corpus("copy", copy / "wiki.parquet", dirs)}


def _loader(corpus: Corpus, kind: str):
    path = corpus.dirs[kind] if kind.startswith("pretok-") else corpus.text
    kw = {} if kind.startswith("pretok-") else {"tokenizer": str(GPT2_JSON)}
    return make_loader(make_dataset(kind, path, SEQ, micro_batch=2, rank=0, world=1, seed=3, **kw))


@pytest.mark.parametrize("kind", KINDS)
def test_a_state_of_other_data_of_the_same_size_is_refused(wiki, variants, kind):
    mine = _loader(wiki, kind)
    it = iter(mine)
    next(it), next(it)
    state = mine.state_dict()
    following = next(it)["input_ids"].tolist()
    other = _loader(variants["reordered"], kind)
    theirs = other.state_dict()
    differs = {k for k in state.keys() | theirs.keys() if state.get(k) != theirs.get(k)}
    assert differs == {"data", "position"}, "the fault needs data that differs only in what it holds"
    with pytest.raises(PretokError, match="loader state is for other data") as e:
        other.load_state_dict(state)
    assert "\n" not in str(e.value)
    for same in ("again", "copy"):  # the same data: resumes where it was
        resumed = _loader(variants[same], kind)
        resumed.load_state_dict(state)
        assert next(iter(resumed))["input_ids"].tolist() == following


def test_a_state_from_before_data_identities_is_accepted(wiki):
    """States saved by earlier versions have no `data`: they are checked on what they record, as before."""
    mine = _loader(wiki, "pretok-memmap")
    next(iter(mine))
    state = mine.state_dict()
    del state["data"]
    again = _loader(wiki, "pretok-memmap")
    again.load_state_dict(state)
    assert again.position == mine.position


@pytest.mark.parametrize("fmt", ["memmap", "token-list", "padded"])
def test_data_identity_is_the_bytes_not_the_manifest(wiki, variants, fmt):
    kind = f"pretok-{fmt}"
    ids = {name: data_identity(read_manifest(c.dirs[kind])) for name, c in [("wiki", wiki), *variants.items()]}
    assert read_manifest(variants["again"].dirs[kind])["manifest_sha256"] != \
        read_manifest(wiki.dirs[kind])["manifest_sha256"]           # made at another time
    assert ids["wiki"] == ids["again"] == ids["copy"] != ids["reordered"]


@pytest.mark.parametrize("twin", ["copy", "again", "same"])
def test_one_dataset_twice_in_a_mixture_is_refused_under_any_path(wiki, pydocs, variants, twin):
    """A copy or a second tokenization of one dataset would serve each sample twice, back to back."""
    again = (wiki if twin == "same" else variants[twin]).dirs["pretok-memmap"]   # "same": one path object twice
    with pytest.raises(PretokError) as e:
        open_mixture([(wiki.dirs["pretok-memmap"], 2), (pydocs.dirs["pretok-memmap"], 1), (again, 1)], SEQ)
    msg = str(e.value)
    assert msg.startswith(f"{again}/manifest.json: ") and "\n" not in msg
    assert "same data" in msg and str(wiki.dirs["pretok-memmap"]) in msg
    mix = open_mixture([(wiki.dirs["pretok-memmap"], 2), (variants["reordered"].dirs["pretok-memmap"], 1)], SEQ)
    assert len(mix.sources) == 2                                    # other data of the same size mixes
    next(iter(make_loader(ShardedBatches(mix, 2, 0, 1))))
