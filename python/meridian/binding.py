"""A PyTorch model's state_dict mapped onto a site's layout.

The site serves the model's floating-point tensors (parameters and float
buffers such as BatchNorm's running statistics) as named float32 tensors in
the layout's order; integer tensors (num_batches_tracked) stay with the
process and are never sent. ModelBinding checks a model against a layout
(naming the first tensor that differs), loads a model received from the
site into the model's own tensors in place, and computes the change since
the model last loaded, in float32, into buffers it reuses, so a commit of
a float32 CPU model makes no copy beyond the one subtraction.
"""

from collections import OrderedDict
from typing import Dict, List, Sequence

import numpy as np
import torch

from .errors import LayoutMismatch, ProtocolError
from .layout import Layout
from .protocol import all_finite

#: torch dtypes a layout may hold, with their layout (safetensors) names.
TORCH_TYPES: Dict[torch.dtype, str] = {
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.float64: "F64",
}


def _describe(name: str, shape: Sequence[int], dtype: str) -> str:
    return "'%s' shape %s %s" % (name, list(shape), dtype)


def floating_tensors(model: torch.nn.Module
                     ) -> "OrderedDict[str, torch.Tensor]":
    """The floating-point tensors of model.state_dict(keep_vars=True), in
    its order: the model's own tensors (writes to them are the model's)."""
    return OrderedDict((name, tensor) for name, tensor in
                       model.state_dict(keep_vars=True).items()
                       if tensor.is_floating_point())


def model_layout(model: torch.nn.Module) -> Layout:
    """The layout of the model's floating-point state_dict tensors in
    state_dict order. LayoutMismatch for a tensor a layout cannot hold (a
    zero dimension, a dtype other than F32/F16/BF16/F64)."""
    entries = []
    for name, tensor in floating_tensors(model).items():
        if tensor.dtype not in TORCH_TYPES:
            raise LayoutMismatch("tensor '%s' has dtype %s; a site holds %s" %
                                 (name, tensor.dtype,
                                  ", ".join(TORCH_TYPES.values())))
        entries.append((name, tuple(tensor.shape), TORCH_TYPES[tensor.dtype]))
    try:
        return Layout.from_shapes(entries)
    except ValueError as error:
        raise LayoutMismatch("the model cannot be served by a site: %s (a "
                             "site's tensors have no zero dimension)" % error
                             ) from None


def check_model(model: torch.nn.Module, layout: Layout) -> None:
    """Raises LayoutMismatch naming the first tensor where the model's
    floating-point state_dict tensors and `layout` differ: a tensor of the
    layout the model lacks, one of another shape or dtype, or a tensor of
    the model the layout lacks."""
    tensors = floating_tensors(model)
    for t in layout.tensors:
        mine = tensors.get(t.name)
        if mine is None:
            raise LayoutMismatch(
                "the model has no floating-point tensor %s of the site's "
                "layout (the model's: %s)" %
                (_describe(t.name, t.shape, t.dtype),
                 ", ".join(tensors) or "none"))
        dtype = TORCH_TYPES.get(mine.dtype, str(mine.dtype))
        if tuple(mine.shape) != t.shape or dtype != t.dtype:
            raise LayoutMismatch(
                "tensor '%s': the model's is shape %s %s, the site's layout "
                "has shape %s %s" % (t.name, list(mine.shape), dtype,
                                     list(t.shape), t.dtype))
    for name, tensor in tensors.items():
        if layout.find(name) is None:
            raise LayoutMismatch(
                "the model's tensor %s is not in the site's layout (a "
                "floating-point tensor must be trained with the site's "
                "model; make it an integer buffer to keep it local)" %
                _describe(name, tuple(tensor.shape),
                          TORCH_TYPES.get(tensor.dtype, str(tensor.dtype))))


class ModelBinding:
    """`model`'s floating-point tensors bound to `layout` (checked at
    construction: LayoutMismatch). With `keep_base` it remembers the model
    last loaded (the base) and computes the change since then.

    Not thread-safe; the model's tensors are looked up afresh on every
    call (a module that replaces a buffer object is still served)."""

    def __init__(self, model: torch.nn.Module, layout: Layout,
                 keep_base: bool = True):
        check_model(model, layout)
        self.model = model
        self.layout = layout
        self._keep_base = keep_base
        self._base: List[np.ndarray] = [np.zeros(t.size, np.float32)
                                        for t in layout.tensors] \
            if keep_base else []
        self._delta: List[np.ndarray] = []

    def tensors(self) -> List[torch.Tensor]:
        """The model's tensors in layout order."""
        state = floating_tensors(self.model)
        out = []
        for t in self.layout.tensors:
            tensor = state.get(t.name)
            if tensor is None or tuple(tensor.shape) != t.shape or \
                    TORCH_TYPES.get(tensor.dtype) != t.dtype:
                check_model(self.model, self.layout)  # names the change
            out.append(tensor)
        return out

    def load(self, arrays: Sequence[np.ndarray],
             check_finite: bool = True) -> None:
        """Copies a whole model from the site (one float32 array per
        tensor, layout order) into the model's tensors in place (converted
        to each tensor's dtype and device), and makes it the base. With
        `check_finite` (leave it to the client that checked the reply
        already) a NaN or Inf raises ProtocolError with the model
        untouched."""
        if len(arrays) != len(self.layout.tensors):
            raise ProtocolError("a model of %d tensors for a layout of %d" %
                                (len(arrays), len(self.layout.tensors)))
        for t, values in zip(self.layout.tensors, arrays):
            if check_finite and not all_finite(values):
                raise ProtocolError("NaN or Inf in tensor '%s' of the site's "
                                    "model" % t.name)
        with torch.no_grad():
            for i, (tensor, values) in enumerate(zip(self.tensors(), arrays)):
                if not values.flags.writeable:  # torch wants writable memory
                    values = np.array(values)
                source = torch.from_numpy(values.astype(np.float32,
                                                        copy=False))
                tensor.copy_(source.view(tensor.shape))
                if not self._keep_base:
                    continue
                if tensor.dtype == torch.float32:
                    # The base is the received model itself (no copy; the
                    # frames stay alive until the next load).
                    self._base[i] = source.numpy()
                else:
                    # What the tensor holds now, after rounding to its
                    # dtype: a commit carries only what training changed.
                    self._base[i] = tensor.detach().reshape(-1).to(
                        "cpu", torch.float32).numpy().copy()

    def delta(self) -> List[np.ndarray]:
        """The change since the base, model - base, one contiguous float32
        array per tensor in layout order. The arrays are reused by the next
        call: send them before then."""
        if not self._keep_base:
            raise RuntimeError("this binding keeps no base")
        if not self._delta:
            self._delta = [np.empty(t.size, np.float32)
                           for t in self.layout.tensors]
        with torch.no_grad():
            for tensor, base, out in zip(self.tensors(), self._base,
                                         self._delta):
                current = tensor.detach().reshape(-1)
                if current.dtype != torch.float32 or \
                        current.device.type != "cpu":
                    current = current.to("cpu", torch.float32)
                torch.sub(current, torch.from_numpy(base),
                          out=torch.from_numpy(out))
        return self._delta
