"""The model's key space: named dense tensors laid end to end in one flat
float32 vector (include/meridian/layout.h). Every payload on the worker
endpoint addresses this space: a COMMIT carries one frame per tensor in
layout order, a PULL range names (tensor, offset, length) in elements.
"""

from dataclasses import dataclass, field
from typing import List, Sequence, Tuple

import numpy as np

from ._proto import wire_pb2


@dataclass(frozen=True)
class TensorInfo:
    """One tensor: its name, row-major shape and place in the flat vector."""
    name: str
    shape: Tuple[int, ...]
    offset: int  # first element in the flat vector
    size: int    # product of shape


@dataclass(frozen=True)
class Layout:
    """Names, shapes and flat offsets of a model's tensors, in order.

    Two layouts are equal when they list the same names with the same
    shapes in the same order (what the site server compares on HELLO).
    """
    tensors: Tuple[TensorInfo, ...] = field(default_factory=tuple)

    @staticmethod
    def from_shapes(named_shapes: Sequence[Tuple[str, Sequence[int]]]):
        """A layout of (name, shape) pairs, in order. ValueError on an empty
        or duplicate name, an empty shape or a zero dimension (the rules of
        ModelLayout::Add)."""
        tensors: List[TensorInfo] = []
        offset = 0
        seen = set()
        for name, shape in named_shapes:
            shape = tuple(int(d) for d in shape)
            if not name:
                raise ValueError("tensor name is empty")
            if name in seen:
                raise ValueError("duplicate tensor name '%s'" % name)
            if not shape:
                raise ValueError("tensor '%s' has an empty shape" % name)
            if any(d <= 0 for d in shape):
                raise ValueError("tensor '%s' has a zero dimension" % name)
            seen.add(name)
            size = int(np.prod(shape, dtype=np.uint64))
            tensors.append(TensorInfo(name, shape, offset, size))
            offset += size
        return Layout(tuple(tensors))

    @staticmethod
    def from_specs(specs) -> "Layout":
        """From repeated pb.TensorSpec (WELCOME.layout, HELLO.layout)."""
        return Layout.from_shapes([(s.name, list(s.shape)) for s in specs])

    def to_specs(self, specs) -> None:
        """Fills repeated pb.TensorSpec `specs` (cleared first)."""
        del specs[:]
        for t in self.tensors:
            spec = specs.add()
            spec.name = t.name
            spec.shape.extend(t.shape)

    @property
    def num_elements(self) -> int:
        return sum(t.size for t in self.tensors)

    def find(self, name: str):
        """The tensor called `name`, or None."""
        for t in self.tensors:
            if t.name == name:
                return t
        return None

    def views(self, flat: np.ndarray):
        """{name: view of `flat` shaped as the tensor}; `flat` must hold
        num_elements values."""
        if flat.size != self.num_elements:
            raise ValueError("flat vector has %d values, the layout %d" %
                             (flat.size, self.num_elements))
        return {t.name: flat[t.offset:t.offset + t.size].reshape(t.shape)
                for t in self.tensors}

    def describe(self) -> str:
        """"fc0.weight[32,784] fc0.bias[32] ..." (as the C++ logs it)."""
        return " ".join("%s[%s]" % (t.name, ",".join(str(d) for d in t.shape))
                        for t in self.tensors)

    def __str__(self) -> str:
        return self.describe()


def layout_for_model(model_config, input_dim: int,
                     num_classes: int = 10) -> Layout:
    """The layout MakeModel (src/train/mlp.cc) builds for a
    pb.ModelConfig: layer l is "fc<l>.weight" [out, in] then "fc<l>.bias"
    [out]; SOFTMAX has one layer (input_dim -> num_classes), MLP one per
    `hidden` width plus the output layer. Workers of a job always have 10
    classes (Fashion-MNIST's). ValueError for what MakeModel refuses."""
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


def tensor_slice(tensor: TensorInfo, offset: int = 0, length: int = None):
    """A pb.TensorSlice naming elements [offset, offset + length) of
    `tensor` (the whole tensor by default), FLOAT32/RAW, payload_bytes set
    as a payload frame of it would need."""
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
