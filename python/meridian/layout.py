"""The model's key space: named dense tensors laid end to end in one flat
vector (include/meridian/core/layout.h; docs/worker-protocol.md section 5).

Every payload on the worker endpoint addresses this space: a COMMIT carries
one frame per tensor in layout order, a PULL range names (tensor, offset,
length) in elements. On the wire every value is float32; each tensor also
has the element type its owner holds it in (F32, F16, BF16, F64), which is
part of the model's identity.
"""

from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Tuple

import numpy as np

from . import wire_pb2

#: Element types a layout may hold (safetensors names), with their wire enum.
TENSOR_TYPES: Dict[str, int] = {
    "F32": wire_pb2.TENSOR_TYPE_F32,
    "F16": wire_pb2.TENSOR_TYPE_F16,
    "BF16": wire_pb2.TENSOR_TYPE_BF16,
    "F64": wire_pb2.TENSOR_TYPE_F64,
}
_TYPE_NAMES = {number: name for name, number in TENSOR_TYPES.items()}


@dataclass(frozen=True)
class TensorInfo:
    """One tensor: its name, row-major shape, place in the flat vector and
    element type ("F32", "F16", "BF16" or "F64")."""
    name: str
    shape: Tuple[int, ...]
    offset: int  # first element in the flat vector
    size: int    # product of shape
    dtype: str = "F32"

    def describe(self) -> str:
        """"fc0.weight[32,784]", with ":F16" appended when not F32."""
        text = "%s[%s]" % (self.name, ",".join(str(d) for d in self.shape))
        return text if self.dtype == "F32" else text + ":" + self.dtype


@dataclass(frozen=True)
class Layout:
    """Names, shapes, element types and flat offsets of a model's tensors,
    in order. Two layouts are equal when they list the same names with the
    same shapes and types in the same order (what a site server compares
    on HELLO)."""
    tensors: Tuple[TensorInfo, ...] = field(default_factory=tuple)

    @staticmethod
    def from_shapes(named_shapes: Iterable[Tuple]) -> "Layout":
        """A layout of (name, shape) or (name, shape, dtype) tuples, in
        order; an empty shape is a scalar (one element). ValueError on an
        empty or duplicate name, a zero dimension or an unknown type (the
        rules of ModelLayout::Add)."""
        tensors: List[TensorInfo] = []
        offset = 0
        seen = set()
        for entry in named_shapes:
            name, shape = entry[0], tuple(int(d) for d in entry[1])
            dtype = entry[2] if len(entry) > 2 else "F32"
            if not name:
                raise ValueError("tensor name is empty")
            if name in seen:
                raise ValueError("duplicate tensor name '%s'" % name)
            if any(d <= 0 for d in shape):
                raise ValueError("tensor '%s' has a zero dimension" % name)
            if dtype not in TENSOR_TYPES:
                raise ValueError("tensor '%s' has type %s; a layout holds %s"
                                 % (name, dtype, ", ".join(TENSOR_TYPES)))
            seen.add(name)
            size = int(np.prod(shape, dtype=np.uint64))
            tensors.append(TensorInfo(name, shape, offset, size, dtype))
            offset += size
        return Layout(tuple(tensors))

    @staticmethod
    def from_specs(specs) -> "Layout":
        """From repeated pb.TensorSpec (WELCOME.layout, HELLO.layout); an
        unset type reads as F32 (older peers)."""
        entries = []
        for s in specs:
            # An unknown type number is refused by from_shapes.
            dtype = (_TYPE_NAMES.get(s.type, "type %d" % s.type)
                     if s.type else "F32")
            entries.append((s.name, list(s.shape), dtype))
        return Layout.from_shapes(entries)

    def to_specs(self, specs) -> None:
        """Fills repeated pb.TensorSpec `specs` (cleared first)."""
        del specs[:]
        for t in self.tensors:
            spec = specs.add()
            spec.name = t.name
            spec.shape.extend(t.shape)
            spec.type = TENSOR_TYPES[t.dtype]

    @property
    def num_elements(self) -> int:
        """Elements of all tensors together."""
        return sum(t.size for t in self.tensors)

    def find(self, name: str) -> Optional[TensorInfo]:
        """The tensor called `name`, or None."""
        for t in self.tensors:
            if t.name == name:
                return t
        return None

    def views(self, flat: np.ndarray) -> Dict[str, np.ndarray]:
        """{name: view of `flat` shaped as the tensor}; `flat` must hold
        num_elements values."""
        if flat.size != self.num_elements:
            raise ValueError("flat vector has %d values, the layout %d" %
                             (flat.size, self.num_elements))
        return {t.name: flat[t.offset:t.offset + t.size].reshape(t.shape)
                for t in self.tensors}

    def first_difference(self, other: "Layout") -> Optional[str]:
        """None when equal; else the first tensor where this layout and
        `other` differ, e.g. "tensor 2: 'fc1.weight[10,32]' here,
        'fc1.weight[10,64]' there"."""
        for i, (a, b) in enumerate(zip(self.tensors, other.tensors)):
            if (a.name, a.shape, a.dtype) != (b.name, b.shape, b.dtype):
                return "tensor %d: '%s' here, '%s' there" % (
                    i, a.describe(), b.describe())
        if len(self.tensors) != len(other.tensors):
            longer = self if len(self.tensors) > len(other.tensors) else other
            extra = longer.tensors[min(len(self.tensors),
                                       len(other.tensors))]
            return "tensor %d: '%s' %s only" % (
                min(len(self.tensors), len(other.tensors)), extra.describe(),
                "here" if longer is self else "there")
        return None

    def describe(self) -> str:
        """"fc0.weight[32,784] fc0.bias[32] ..." (as the C++ logs it)."""
        return " ".join(t.describe() for t in self.tensors)

    def __str__(self) -> str:
        return self.describe()


def layout_for_model(model_config, input_dim: int,
                     num_classes: int = 10) -> Layout:
    """The layout MakeModel (src/train/mlp.cc) builds for a built-in
    pb.ModelConfig: layer l is "fc<l>.weight" [out, in] then "fc<l>.bias"
    [out]; SOFTMAX has one layer (input_dim -> num_classes), MLP one per
    `hidden` width plus the output layer. Workers of a job always have 10
    classes (Fashion-MNIST's). ValueError for other kinds and for what
    MakeModel refuses."""
    kind = model_config.kind  # proto2 default: MLP
    hidden = list(model_config.hidden)
    if kind == 1:  # SOFTMAX
        if hidden:
            raise ValueError("model.kind SOFTMAX has no hidden layers")
    elif kind == 2:  # MLP
        if not hidden:
            raise ValueError("model.kind MLP needs at least one hidden layer")
        if any(w <= 0 for w in hidden):
            raise ValueError("model.hidden widths must be positive")
    else:
        raise ValueError("model.kind must be SOFTMAX or MLP, got %d" % kind)
    widths = [input_dim] + hidden + [num_classes]
    shapes = []
    for layer in range(len(widths) - 1):
        shapes.append(("fc%d.weight" % layer, (widths[layer + 1],
                                               widths[layer])))
        shapes.append(("fc%d.bias" % layer, (widths[layer + 1],)))
    return Layout.from_shapes(shapes)


def tensor_slice(tensor: TensorInfo, offset: int = 0,
                 length: Optional[int] = None) -> "wire_pb2.TensorSlice":
    """A pb.TensorSlice naming elements [offset, offset + length) of
    `tensor` (the whole tensor by default), FLOAT32/RAW, payload_bytes set
    as a payload frame of it needs."""
    if length is None:
        length = tensor.size - offset
    s = wire_pb2.TensorSlice()
    s.tensor = tensor.name
    s.offset = offset
    s.length = length
    s.dtype = wire_pb2.DTYPE_FLOAT32
    s.codec = wire_pb2.CODEC_RAW
    s.payload_bytes = 4 * length
    return s

