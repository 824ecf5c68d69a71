"""The tokenize engine: inputs → planned units → worker pool → committed parts → final files + manifest.json.

    run.py            `run_tokenize`: plan, prepare the output, check the backend, tokenize, finalize; resume; shards
    config.py         `TokenizeConfig`: every `pretok tokenize` setting and its default (the CLI's too; light)
    parts.py          one unit → one committed part (read, tokenize, BOS/EOS policy, write); the part record
    workers.py        the worker pool, main-process side
    zygote.py         the process that builds the encoder once and forks CPU-pinned workers
    memmap_place.py   memmap parts placed into one `.bin` by the workers at offsets handed out in order
    outdir.py         the output directory: lock, config check, resume state
    finalize.py       the end of a run: skipped-document budget, manifest.json written last (a merge's too)
    boundaries.py     document boundaries: separator / truncated share in the manifest, their warnings, empty shards
    progress.py       the progress bar: MB/s, docs/s, tokens/s, ETA
    merge.py          `pretok merge`: join shard outputs
    verify.py         `pretok inspect` and `pretok verify`

The Python API is re-exported by `pretok_lib.pretokenize`; docs/ENGINE.md explains the design. Importing this
package imports none of its modules (the command line reads `config` alone, without numpy or pyarrow).
"""
