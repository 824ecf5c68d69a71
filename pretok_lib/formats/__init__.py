"""On-disk token formats written and read by pretok, and the names every other module takes from here."""

FORMATS = ("memmap", "token-list", "padded")  # every format pretok writes, in the order benchmarks and studies list
TRAIN_COMPRESSION = "zstd:3"  # the parquet codec `pretok tokenize` writes by default and the training runs read
CODEC_GRID = ("none", "snappy", TRAIN_COMPRESSION, "zstd:22")  # the parquet codecs the benchmarks and studies compare
