"""Text columns in Arrow: which types count as text, casting them to one layout, UTF-8 checks and byte lengths."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np


def is_text_type(typ) -> bool:
    """A string column of any Arrow layout: (large_)string, string_view, or dictionary-encoded strings."""
    import pyarrow as pa

    if pa.types.is_dictionary(typ):
        typ = typ.value_type
    return pa.types.is_string(typ) or pa.types.is_large_string(typ) or pa.types.is_string_view(typ)


def as_string_array(arr):
    """A text column as a plain (large_)string array: dictionary and view layouts are cast (large: no 2 GB
    offset limit)."""
    import pyarrow as pa

    if hasattr(arr, "combine_chunks"):
        arr = arr.combine_chunks()
    if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
        return arr
    return arr.cast(pa.large_string())


def parquet_leaves(typ) -> int:
    """How many Parquet leaf columns an Arrow field of this type is stored as."""
    import pyarrow as pa

    if isinstance(typ, pa.ExtensionType):
        return parquet_leaves(typ.storage_type)
    if pa.types.is_struct(typ):
        return sum(parquet_leaves(typ.field(i).type) for i in range(typ.num_fields))
    if pa.types.is_map(typ):
        return parquet_leaves(typ.key_type) + parquet_leaves(typ.item_type)
    if pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_fixed_size_list(typ) or \
            pa.types.is_list_view(typ) or pa.types.is_large_list_view(typ):
        return parquet_leaves(typ.value_type)
    return 1


class _Marker:
    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return self.name


MISSING, INVALID = _Marker("MISSING"), _Marker("INVALID")  # a record without the text key; undecodable bytes


def utf8_valid(arr) -> bool:
    """Whether every string of an Arrow string array is valid UTF-8 (Parquet files need not hold valid UTF-8)."""
    import pyarrow as pa

    try:
        arr.validate(full=True)
    except pa.ArrowInvalid:
        return False
    return True


def decode_each(arr) -> list:
    """The strings of an Arrow string array holding invalid UTF-8: str, None, or INVALID per document."""
    import pyarrow as pa

    raw = arr.view(pa.large_binary() if pa.types.is_large_string(arr.type) else pa.binary()).to_pylist()
    out: list = []
    for b in raw:
        try:
            out.append(None if b is None else b.decode("utf-8"))
        except UnicodeDecodeError:
            out.append(INVALID)
    return out


def byte_lengths(arr) -> "np.ndarray":
    """UTF-8 byte length of every string of an Arrow (large_)string array, from its offsets buffer (null: 0).
    Not `pc.binary_length(...).to_numpy()`: pyarrow's to_numpy/fill_null import pandas, ~0.4 s in each worker."""
    import numpy as np
    import pyarrow as pa

    if pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type):
        dtype = np.int64
    elif pa.types.is_string(arr.type) or pa.types.is_binary(arr.type):
        dtype = np.int32
    else:  # string views and others: the generic (slower to import) way
        import pyarrow.compute as pc

        return pc.binary_length(arr).fill_null(0).to_numpy(zero_copy_only=False)
    if len(arr) == 0:
        return np.zeros(0, dtype=np.int64)
    offsets = np.frombuffer(arr.buffers()[1], dtype=dtype)[arr.offset:arr.offset + len(arr) + 1]
    return np.diff(offsets).astype(np.int64, copy=False)
