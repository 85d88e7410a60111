"""Tensor files in the safetensors format, written and read with the
standard library, numpy and torch (no `safetensors` package needed):

    8 bytes   N, the JSON header's length, unsigned little-endian
    N bytes   {"__metadata__": {"key": "value", ...},
               "<name>": {"dtype": "F32", "shape": [d0, ...],
                          "data_offsets": [begin, end]}, ...}
              padded with spaces to a multiple of 8 bytes
    the rest  the tensors' bytes, row-major, little-endian, each at
              [begin, end) of this buffer, one after the other

The files are what Meridian's sites read (include/meridian/train/
safetensors.h): the initial weights of a model the servers do not
implement (model { kind: EXTERNAL weights: "..." }), whose floating-point
tensors, in the order of their data, are the site's layout, and the final
per-site models the servers write. The reader here is as strict as the C++
one: known dtypes, sizes that match the shapes, byte ranges that tile the
data buffer exactly, string metadata, unique non-empty names.
"""

import json
import os
import tempfile
from collections import OrderedDict
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Tuple, Union

import numpy as np
import torch

from .layout import TENSOR_TYPES, Layout

#: Header limit (the reference implementation refuses headers over 100 MB).
MAX_HEADER_BYTES = 100 << 20

# safetensors dtype -> (torch dtype, little-endian numpy dtype of its bytes).
# BF16 has no numpy type: its bytes travel as int16 and are viewed.
_DTYPES: Dict[str, Tuple[torch.dtype, np.dtype]] = {
    "F32": (torch.float32, np.dtype("<f4")),
    "F16": (torch.float16, np.dtype("<f2")),
    "BF16": (torch.bfloat16, np.dtype("<i2")),
    "F64": (torch.float64, np.dtype("<f8")),
    "I64": (torch.int64, np.dtype("<i8")),
    "I32": (torch.int32, np.dtype("<i4")),
    "I16": (torch.int16, np.dtype("<i2")),
    "I8": (torch.int8, np.dtype("i1")),
    "U8": (torch.uint8, np.dtype("u1")),
    "BOOL": (torch.bool, np.dtype("?")),
}
_NAMES_BY_TORCH = {torch_type: name
                   for name, (torch_type, _) in _DTYPES.items()}

StateDict = Mapping[str, torch.Tensor]


def dtype_name(dtype: torch.dtype) -> str:
    """The safetensors name of a torch dtype ("F32", "BF16", "I64", ...).
    ValueError for a dtype the format (as Meridian reads it) lacks."""
    try:
        return _NAMES_BY_TORCH[dtype]
    except KeyError:
        raise ValueError("tensors of dtype %s cannot be stored (Meridian's "
                         "tensor files hold %s)" %
                         (dtype, " ".join(_DTYPES))) from None


@dataclass(frozen=True)
class FileTensor:
    """One tensor of a file's header: where its bytes are in the data
    buffer (byte offsets)."""
    name: str
    dtype: str
    shape: Tuple[int, ...]
    begin: int
    end: int


def _little_endian_bytes(tensor: torch.Tensor) -> np.ndarray:
    """The tensor's elements, row-major, as a little-endian numpy array
    (a view when no conversion is needed)."""
    t = tensor.detach().to("cpu").contiguous()
    byte_type = _DTYPES[dtype_name(t.dtype)][1]
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return np.ascontiguousarray(t.numpy().reshape(-1), dtype=byte_type)


def _state_dict_of(model_or_state_dict) -> StateDict:
    if isinstance(model_or_state_dict, torch.nn.Module):
        return model_or_state_dict.state_dict()
    if isinstance(model_or_state_dict, Mapping):
        return model_or_state_dict
    raise TypeError("expected an nn.Module or a state_dict (a mapping of "
                    "names to tensors), got %s" %
                    type(model_or_state_dict).__name__)


def save_initial_weights(model_or_state_dict: Union[torch.nn.Module,
                                                    StateDict],
                         path: Union[str, os.PathLike],
                         metadata: Optional[Mapping[str, str]] = None
                         ) -> Layout:
    """Writes the model's state_dict (or a state_dict) to `path` as a
    safetensors file, the tensors in state_dict order: the initial weights
    of a job's EXTERNAL model (`model { weights: "..." }`), from which
    every site starts bit-identical.

    Floating-point tensors (F32, F16, BF16, F64: parameters and buffers
    such as BatchNorm's running statistics) become the site's layout, in
    this order; integer and bool tensors (num_batches_tracked) are stored
    but stay with each worker. A floating-point tensor must have at least
    one dimension and no zero dimension (ValueError otherwise, naming it).
    `metadata` (strings) goes into "__metadata__". The bytes are those
    Meridian's C++ writer (WriteSafetensors) makes of the same tensors.
    The file is replaced atomically. Returns the layout the sites will
    serve."""
    state = _state_dict_of(model_or_state_dict)
    header: Dict[str, object] = OrderedDict()
    if metadata:
        for key, value in metadata.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise TypeError("metadata must map strings to strings")
        # Sorted, as the C++ writer's std::map writes them.
        header["__metadata__"] = OrderedDict(sorted(metadata.items()))
    arrays: List[np.ndarray] = []
    layout_entries = []
    offset = 0
    for name, tensor in state.items():
        if not isinstance(name, str) or not name:
            raise ValueError("tensor names must be non-empty strings, got "
                             "%r" % (name,))
        if not isinstance(tensor, torch.Tensor):
            raise TypeError("'%s' is a %s, not a torch.Tensor" %
                            (name, type(tensor).__name__))
        dtype = dtype_name(tensor.dtype)
        shape = tuple(int(d) for d in tensor.shape)
        if dtype in TENSOR_TYPES:
            if not shape or 0 in shape:
                raise ValueError(
                    "floating-point tensor '%s' has shape %s: a site's "
                    "layout holds tensors with at least one dimension and "
                    "no zero dimension (make it a buffer of shape [1], or "
                    "an integer tensor if it should stay local)" %
                    (name, list(shape)))
            layout_entries.append((name, shape, dtype))
        data = _little_endian_bytes(tensor)
        header[name] = OrderedDict([
            ("dtype", dtype), ("shape", list(shape)),
            ("data_offsets", [offset, offset + data.nbytes])])
        offset += data.nbytes
        arrays.append(data)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    handle, temporary = tempfile.mkstemp(prefix=".weights-", dir=directory)
    try:
        with os.fdopen(handle, "wb") as f:
            f.write(len(text).to_bytes(8, "little"))
            f.write(text)
            for data in arrays:
                f.write(memoryview(data).cast("B"))
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise
    return Layout.from_shapes(layout_entries)


def _no_duplicates(pairs):
    seen = OrderedDict()
    for key, value in pairs:
        if key in seen:
            raise ValueError("duplicate key '%s'" % key)
        seen[key] = value
    return seen


def _whole_number(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and \
        value >= 0


def _parse_header(text: bytes, data_bytes: int, what: str
                  ) -> Tuple[List[FileTensor], Dict[str, str]]:
    try:
        header = json.loads(text.decode("utf-8"),
                            object_pairs_hook=_no_duplicates)
    except (UnicodeDecodeError, ValueError) as error:
        raise ValueError("%s: the header is not a JSON object: %s" %
                         (what, error)) from None
    if not isinstance(header, dict):
        raise ValueError("%s: the header is not a JSON object" % what)
    metadata: Dict[str, str] = {}
    tensors: List[FileTensor] = []
    for name, entry in header.items():
        if name == "__metadata__":
            if not isinstance(entry, dict):
                raise ValueError("%s: __metadata__ is not an object" % what)
            for key, value in entry.items():
                if not isinstance(value, str):
                    raise ValueError("%s: __metadata__ '%s' is not a string"
                                     % (what, key))
                metadata[key] = value
            continue
        where = "%s: tensor '%s'" % (what, name)
        if not name:
            raise ValueError("%s: a tensor has an empty name" % what)
        if not isinstance(entry, dict) or set(entry) != {
                "dtype", "shape", "data_offsets"}:
            raise ValueError("%s: expected exactly dtype, shape and "
                             "data_offsets" % where)
        dtype = entry["dtype"]
        if dtype not in _DTYPES:
            raise ValueError("%s: unknown dtype %r" % (where, dtype))
        shape = entry["shape"]
        if not isinstance(shape, list) or not all(_whole_number(d)
                                                  for d in shape):
            raise ValueError("%s: the shape is not a list of whole numbers"
                             % where)
        offsets = entry["data_offsets"]
        if (not isinstance(offsets, list) or len(offsets) != 2 or
                not all(_whole_number(o) for o in offsets) or
                offsets[1] < offsets[0]):
            raise ValueError("%s: data_offsets is not [begin, end] with "
                             "begin <= end" % where)
        size = _DTYPES[dtype][1].itemsize * int(np.prod(shape,
                                                        dtype=np.uint64))
        if offsets[1] - offsets[0] != size:
            raise ValueError("%s: %d bytes of data for shape %s of %s (%d "
                             "bytes)" % (where, offsets[1] - offsets[0],
                                         shape, dtype, size))
        tensors.append(FileTensor(name, dtype, tuple(shape), offsets[0],
                                  offsets[1]))
    tensors.sort(key=lambda t: (t.begin, t.end))
    next_byte = 0
    for t in tensors:
        if t.begin != next_byte:
            raise ValueError("%s: tensor '%s' starts at byte %d, expected %d "
                             "(%s)" % (what, t.name, t.begin, next_byte,
                                       "it overlaps the tensor before"
                                       if t.begin < next_byte
                                       else "a gap before it"))
        next_byte = t.end
    if next_byte != data_bytes:
        raise ValueError("%s: the tensors hold %d bytes of data, the file has "
                         "%d (%s)" % (what, next_byte, data_bytes,
                                      "truncated" if next_byte > data_bytes
                                      else "bytes after the last tensor"))
    return tensors, metadata


def _read_prefix(f, what: str, file_bytes: int) -> Tuple[bytes, int]:
    """The header text and the data buffer's size."""
    if file_bytes < 8:
        raise ValueError("%s: %d bytes: too short for a safetensors file (it "
                         "starts with an 8-byte header length)" %
                         (what, file_bytes))
    length = int.from_bytes(f.read(8), "little")
    if length > MAX_HEADER_BYTES:
        raise ValueError("%s: a header of %d bytes exceeds the limit of %d "
                         "(not a safetensors file?)" %
                         (what, length, MAX_HEADER_BYTES))
    if length > file_bytes - 8:
        raise ValueError("%s: the header says %d bytes, the file has %d after "
                         "the length (truncated?)" %
                         (what, length, file_bytes - 8))
    return f.read(length), file_bytes - 8 - length


def read_header(path: Union[str, os.PathLike]
                ) -> Tuple[List[FileTensor], Dict[str, str]]:
    """The tensors of a file's header in the order of their data, and its
    metadata, checked as load_weights checks them, without reading the
    data. ValueError when malformed, OSError when unreadable."""
    what = os.fspath(path)
    with open(what, "rb") as f:
        text, data_bytes = _read_prefix(f, what, os.fstat(f.fileno()).st_size)
    return _parse_header(text, data_bytes, what)


def weights_layout(path: Union[str, os.PathLike]) -> Layout:
    """The layout the sites serve for an initial-weights file: its
    floating-point tensors in the order of their data (integer tensors
    stay with the workers)."""
    tensors, _ = read_header(path)
    try:
        return Layout.from_shapes([(t.name, t.shape, t.dtype)
                                   for t in tensors
                                   if t.dtype in TENSOR_TYPES])
    except ValueError as error:
        raise ValueError("%s: %s" % (os.fspath(path), error)) from None


def load_weights(path: Union[str, os.PathLike]
                 ) -> "OrderedDict[str, torch.Tensor]":
    """Every tensor of a safetensors file, in the order of its data, as CPU
    torch tensors of the file's dtypes (load it with
    model.load_state_dict(...)). Reads the initial weights and the final
    per-site models the site servers write. ValueError when the file is
    malformed (named, with the tensor and what is wrong)."""
    what = os.fspath(path)
    with open(what, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        text, data_bytes = _read_prefix(f, what, size)
        tensors, _ = _parse_header(text, data_bytes, what)
        data = bytearray(data_bytes)
        if f.readinto(data) != data_bytes:
            raise ValueError("%s: truncated while reading" % what)
    out: "OrderedDict[str, torch.Tensor]" = OrderedDict()
    for t in tensors:
        _, byte_type = _DTYPES[t.dtype]
        count = (t.end - t.begin) // byte_type.itemsize
        native = byte_type.newbyteorder("=")
        values = (np.frombuffer(data, dtype=byte_type, count=count,
                                offset=t.begin).astype(native, copy=True)
                  if count else np.empty(0, dtype=native))
        tensor = torch.from_numpy(values)
        if t.dtype == "BF16":
            tensor = tensor.view(torch.bfloat16)
        out[t.name] = tensor.reshape(t.shape)
    return out
