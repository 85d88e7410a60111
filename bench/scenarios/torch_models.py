#!/usr/bin/env python3
"""PyTorch twins of Meridian's model presets, and one training step timed.

    bench/scenarios/torch_models.py [--presets a,b,...] [--batches 16,64]
                                    [--threads T] [--min-time S]

The PyTorch half of bench/scenarios/workload_speed (which imports build()
and measure() from here). Input 1x28x28 (Fashion-MNIST), 10 classes;
flatten is C,H,W (x.flatten(1)); conv layers have a bias; a norm layer sits
between its conv and the ReLU. maxpool2 = MaxPool2d(2, 2).

  lenet5        conv 1->6 k5 p2, relu, maxpool2 | conv 6->16 k5 p0, relu,
                maxpool2 | flatten 400 | dense 120 relu | 84 relu | 10
  lenet5-bn     BatchNorm2d after each conv (eps 1e-5, momentum 0.1)
  lenet5-gn     GroupNorm(2, 6) and GroupNorm(4, 16) after the convs
  vgg-small     conv 1->16 k3 p1, relu, conv 16->16, relu, maxpool2 |
                conv 16->32, relu, conv 32->32, relu, maxpool2 |
                flatten 1568 | dense 128 relu | 10
  vgg-small-bn  BatchNorm2d after each conv
  vgg-small-gn  GroupNorm(C / 4, C) after each conv
  mlp           dense 784->256 relu -> 10 (Meridian's default MLP)
  mf            matrix factorisation (Meridian's MATRIX_FACTORIZATION):
                users 10000, items 2000, rank 16, l2 0.02; see below

The step: zero_grad(set_to_none=True), mean cross-entropy of the forward
pass, backward, SGD (lr 0.01, momentum 0.9, no weight decay), model in
train mode, on a random N(0, 1) batch already in memory; warm-up of at least
20 steps and min(0.5 s, S), then whole steps timed with time.perf_counter
for at least S seconds: samples/s = steps * B / elapsed.

mf is not a classifier: a sample is one rating (user, item, r in 1..5),
prediction = g + b_u[user] + b_i[item] + U[user] . V[item] (nn.Embedding
for U, V, b_u, b_i; g an nn.Parameter of one element), loss = mean over
the batch of (prediction - r)^2 / 2 + l2 / 2 * (|U[user]|^2 + |V[item]|^2
+ b_u^2 + b_i^2) (the L2 of the rows each rating touches), plain SGD (lr
0.05, momentum 0). Pairs: items Zipf(1.0), users Zipf(0.5), each ranking
mapped through a random permutation of the ids; ratings uniform in 1..5;
the indices are int64 tensors made before timing, and the step cycles
through max(8, 65536 / B) such batches. Two variants, both measured:
  dense   nn.Embedding(sparse=False) (PyTorch's default): the backward
          writes whole-table gradients and SGD updates every row
  sparse  nn.Embedding(sparse=True): sparse row gradients, SGD adds them
          (torch.optim.SGD takes sparse gradients without momentum)
variants(preset) lists them (one None variant for the other presets).

Run alone, prints each preset's parameter count (weights, biases and norm
affine parameters; BatchNorm running statistics excluded) and its samples/s.
Needs torch (Debian: python3-torch, for /usr/bin/python3): when the
interpreter running this has no torch, the script re-executes itself under
/usr/bin/python3.
"""

import argparse
import os
import sys
import time

SYSTEM_PYTHON = "/usr/bin/python3"
_REEXEC_GUARD = "MERIDIAN_TORCH_REEXEC"

INPUT_SHAPE = (1, 28, 28)
CLASSES = 10
LEARNING_RATE = 0.01
MOMENTUM = 0.9

# Convolutional presets: conv stages (each a list of (out_channels, kernel,
# padding) convs followed by maxpool2), the dense widths after the flatten
# (the last one is the classifier), and the norm after each conv: None,
# "bn", or ("gn", groups per conv in order).
_CONV_PRESETS = {
    "lenet5": ([[(6, 5, 2)], [(16, 5, 0)]], [120, 84, CLASSES]),
    "vgg-small": ([[(16, 3, 1), (16, 3, 1)], [(32, 3, 1), (32, 3, 1)]],
                  [128, CLASSES]),
}
PRESETS = ("lenet5", "lenet5-bn", "lenet5-gn", "vgg-small", "vgg-small-bn",
           "vgg-small-gn", "mlp", "mf")
MLP_HIDDEN = 256

# Matrix factorisation (preset "mf"): the default job's rating matrix and
# model (RatingsConfig and ModelConfig defaults), plain SGD.
MF_USERS = 10000
MF_ITEMS = 2000
MF_RANK = 16
MF_L2 = 0.02
MF_LEARNING_RATE = 0.05
MF_ITEM_ZIPF = 1.0
MF_USER_ZIPF = 0.5
MF_RATINGS_CYCLED = 65536  # ratings in the batches a measurement cycles
MF_MIN_BATCHES = 8
MF_VARIANTS = ("dense", "sparse")


def require_torch(script=None, argv=None):
    """Returns the torch module. When this interpreter has none and
    /usr/bin/python3 is another interpreter, re-executes `script` (with
    `argv`) under it; `script` None: raises SystemExit instead."""
    try:
        import torch  # noqa: F401
        return torch
    except ImportError as error:
        reason = str(error)
    here = os.path.realpath(sys.executable or "")
    if (script is not None and os.path.exists(SYSTEM_PYTHON)
            and os.path.realpath(SYSTEM_PYTHON) != here
            and not os.environ.get(_REEXEC_GUARD)):
        os.environ[_REEXEC_GUARD] = sys.executable or "?"
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(SYSTEM_PYTHON,
                 [SYSTEM_PYTHON, os.path.abspath(script)] + list(argv or []))
    tried = []
    for interpreter in (os.environ.get(_REEXEC_GUARD), sys.executable):
        if interpreter and interpreter not in tried:
            tried.append(interpreter)
    raise SystemExit(
        f"PyTorch is not importable ({reason}; tried {', '.join(tried)}). "
        "Install Debian's package python3-torch (apt-get install "
        "python3-torch), which provides torch for /usr/bin/python3.")


def _split(preset):
    """(base, norm) of a preset name; norm None, "bn" or "gn"."""
    for suffix in ("-bn", "-gn"):
        if preset.endswith(suffix):
            return preset[:-len(suffix)], suffix[1:]
    return preset, None


def _gn_groups(base, channels):
    if base == "lenet5":
        return {6: 2, 16: 4}[channels]
    return channels // 4


def layers(preset):
    """The preset as a list of layer specs (tuples), input to output:
    ("conv", in, out, k, pad), ("bn", C), ("gn", groups, C), ("relu",),
    ("maxpool2",), ("flatten",), ("dense", in, out). mf has no layers: an
    empty list."""
    if preset == "mf":
        return []
    if preset == "mlp":
        return [("flatten",), ("dense", 784, MLP_HIDDEN), ("relu",),
                ("dense", MLP_HIDDEN, CLASSES)]
    base, norm = _split(preset)
    if base not in _CONV_PRESETS or preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r} (one of "
                         f"{', '.join(PRESETS)})")
    stages, dense = _CONV_PRESETS[base]
    channels, height, width = INPUT_SHAPE
    out = []
    for stage in stages:
        for out_channels, kernel, pad in stage:
            out.append(("conv", channels, out_channels, kernel, pad))
            channels = out_channels
            height = height + 2 * pad - kernel + 1
            width = width + 2 * pad - kernel + 1
            if norm == "bn":
                out.append(("bn", channels))
            elif norm == "gn":
                out.append(("gn", _gn_groups(base, channels), channels))
            out.append(("relu",))
        out.append(("maxpool2",))
        height //= 2
        width //= 2
    out.append(("flatten",))
    features = channels * height * width
    for i, units in enumerate(dense):
        out.append(("dense", features, units))
        features = units
        if i + 1 < len(dense):
            out.append(("relu",))
    return out


def parameter_count(preset):
    """Weights + biases + norm affine parameters, from the layer specs (no
    torch needed); BatchNorm running statistics are not parameters. mf:
    both factor tables and both bias tables."""
    if preset == "mf":
        return (MF_USERS + MF_ITEMS) * (MF_RANK + 1)
    total = 0
    for spec in layers(preset):
        if spec[0] == "conv":
            _, cin, cout, k, _ = spec
            total += cin * cout * k * k + cout
        elif spec[0] == "bn":
            total += 2 * spec[1]
        elif spec[0] == "gn":
            total += 2 * spec[2]
        elif spec[0] == "dense":
            total += spec[1] * spec[2] + spec[2]
    return total


def describe(preset):
    """One line: the layers of the preset."""
    if preset == "mf":
        return (f"MF users {MF_USERS} items {MF_ITEMS} rank {MF_RANK} "
                f"l2 {MF_L2:g}, SGD lr {MF_LEARNING_RATE:g} momentum 0")
    parts = []
    for spec in layers(preset):
        kind = spec[0]
        if kind == "conv":
            parts.append(f"conv{spec[1]}->{spec[2]} k{spec[3]} p{spec[4]}")
        elif kind == "bn":
            parts.append(f"BN({spec[1]})")
        elif kind == "gn":
            parts.append(f"GN({spec[1]},{spec[2]})")
        elif kind == "dense":
            parts.append(f"dense{spec[1]}->{spec[2]}")
        else:
            parts.append(kind)
    return " ".join(parts)


def variants(preset):
    """The PyTorch variants measure() takes for `preset`: ("dense",
    "sparse") for mf, (None,) for the others."""
    return MF_VARIANTS if preset == "mf" else (None,)


def _build_mf(sparse):
    """The mf model: an nn.Module whose forward(users, items, ratings)
    returns the regularised mean loss. Factors N(0, 0.1), biases 0;
    predictions are centred on 3 (no trained global bias, as in Meridian's
    src/train/mf.cc)."""
    torch = require_torch()
    nn = torch.nn

    class MatrixFactorization(nn.Module):
        def __init__(self):
            super().__init__()
            self.user_factors = nn.Embedding(MF_USERS, MF_RANK, sparse=sparse)
            self.item_factors = nn.Embedding(MF_ITEMS, MF_RANK, sparse=sparse)
            self.user_bias = nn.Embedding(MF_USERS, 1, sparse=sparse)
            self.item_bias = nn.Embedding(MF_ITEMS, 1, sparse=sparse)
            with torch.no_grad():
                self.user_factors.weight.normal_(0.0, 0.1)
                self.item_factors.weight.normal_(0.0, 0.1)
                self.user_bias.weight.zero_()
                self.item_bias.weight.zero_()

        def forward(self, users, items, ratings):
            u = self.user_factors(users)
            v = self.item_factors(items)
            bu = self.user_bias(users).squeeze(1)
            bi = self.item_bias(items).squeeze(1)
            prediction = 3.0 + bu + bi + (u * v).sum(1)
            error = prediction - ratings
            penalty = (u.square().sum(1) + v.square().sum(1) + bu.square()
                       + bi.square())
            return (0.5 * error.square() + (0.5 * MF_L2) * penalty).mean()

    return MatrixFactorization()


def mf_batches(batch, seed=0):
    """The rating batches mf cycles through: a list of (users, items,
    ratings) tensors (int64, int64, float32), max(8, 65536 / B) of them."""
    torch = require_torch()
    generator = torch.Generator().manual_seed(1000 + seed)

    def zipf(n, exponent, count):
        weights = 1.0 / torch.arange(1, n + 1, dtype=torch.float64) ** exponent
        ranks = torch.multinomial(weights, count, replacement=True,
                                  generator=generator)
        return torch.randperm(n, generator=generator)[ranks]

    count = max(MF_MIN_BATCHES, MF_RATINGS_CYCLED // batch)
    out = []
    for _ in range(count):
        users = zipf(MF_USERS, MF_USER_ZIPF, batch)
        items = zipf(MF_ITEMS, MF_ITEM_ZIPF, batch)
        ratings = torch.randint(1, 6, (batch,), generator=generator).float()
        out.append((users.contiguous(), items.contiguous(), ratings))
    return out


def build(preset, variant=None):
    """The preset as a torch nn.Module (nn.Sequential), default init; mf
    (variant "dense" or "sparse") as its own module."""
    torch = require_torch()
    nn = torch.nn
    if preset == "mf":
        if variant not in MF_VARIANTS:
            raise ValueError(f"mf variant {variant!r}: one of "
                             f"{', '.join(MF_VARIANTS)}")
        model = _build_mf(variant == "sparse")
        counted = sum(p.numel() for p in model.parameters())
        if counted != parameter_count(preset):
            raise AssertionError(f"mf: torch counts {counted} parameters, "
                                 f"the spec {parameter_count(preset)}")
        return model
    modules = []
    for spec in layers(preset):
        kind = spec[0]
        if kind == "conv":
            _, cin, cout, k, pad = spec
            modules.append(nn.Conv2d(cin, cout, k, padding=pad, bias=True))
        elif kind == "bn":
            modules.append(nn.BatchNorm2d(spec[1], eps=1e-5, momentum=0.1,
                                          affine=True))
        elif kind == "gn":
            modules.append(nn.GroupNorm(spec[1], spec[2], eps=1e-5,
                                        affine=True))
        elif kind == "relu":
            modules.append(nn.ReLU())
        elif kind == "maxpool2":
            modules.append(nn.MaxPool2d(2, 2))
        elif kind == "flatten":
            modules.append(nn.Flatten(1))
        elif kind == "dense":
            modules.append(nn.Linear(spec[1], spec[2]))
        else:
            raise AssertionError(spec)
    model = nn.Sequential(*modules)
    counted = sum(p.numel() for p in model.parameters())
    if counted != parameter_count(preset):
        raise AssertionError(f"{preset}: torch counts {counted} parameters, "
                             f"the spec {parameter_count(preset)}")
    return model


def default_batches(preset):
    """The batch sizes measured when none are given: 64 and 1024 for mf,
    16 and 64 for the others."""
    return [64, 1024] if preset == "mf" else [16, 64]


def set_threads(threads):
    """Intra-op threads T, one inter-op thread. Call once, before any torch
    work (set_num_interop_threads fails after the pool has started)."""
    torch = require_torch()
    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass  # already started (set once per process); not ours to change


def torch_info():
    """What the header of a results table says about torch."""
    torch = require_torch()
    mkldnn = torch.backends.mkldnn
    return {
        "torch_version": torch.__version__,
        "mkldnn_available": bool(mkldnn.is_available()),
        "mkldnn_enabled": bool(mkldnn.enabled),
        "intra_op_threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "python": sys.executable,
    }


def measure(preset, batch, min_time=2.0, warmup_steps=20, warmup_s=0.5,
            seed=0, variant=None):
    """Samples/s of one training step of `preset` at batch `batch`: a fresh
    model, warm-up, then whole steps for at least `min_time` seconds. mf:
    `variant` "dense" or "sparse" (None: "dense"), samples are ratings."""
    torch = require_torch()
    functional = torch.nn.functional
    torch.manual_seed(seed)
    if preset == "mf":
        variant = variant or "dense"
        model = build(preset, variant)
        model.train()
        opt = torch.optim.SGD(model.parameters(), lr=MF_LEARNING_RATE,
                              momentum=0.0, weight_decay=0.0)
        batches = mf_batches(batch, seed)
        cursor = [0]

        def step():
            users, items, ratings = batches[cursor[0]]
            cursor[0] = (cursor[0] + 1) % len(batches)
            opt.zero_grad(set_to_none=True)
            loss = model(users, items, ratings)
            loss.backward()
            opt.step()
            return loss
    else:
        if variant is not None:
            raise ValueError(f"{preset} has no variant {variant!r}")
        model = build(preset)
        model.train()
        opt = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE,
                              momentum=MOMENTUM, weight_decay=0.0)
        x = torch.randn(batch, *INPUT_SHAPE, dtype=torch.float32)
        y = torch.randint(0, CLASSES, (batch,), dtype=torch.int64)

        def step():
            opt.zero_grad(set_to_none=True)
            loss = functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            return loss

    warmup_until = time.perf_counter() + min(warmup_s, min_time)
    done = 0
    while done < warmup_steps or time.perf_counter() < warmup_until:
        step()
        done += 1

    steps = 0
    cpu_start = time.process_time()
    start = time.perf_counter()
    while True:
        loss = step()
        steps += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_time:
            break
    cpu = time.process_time() - cpu_start
    final_loss = float(loss.detach())
    if final_loss != final_loss or final_loss in (float("inf"),
                                                  float("-inf")):
        raise RuntimeError(f"{preset} batch {batch}: the loss is not finite")
    return {
        "variant": variant,
        "samples_per_s": steps * batch / elapsed,
        "steps": steps,
        "elapsed_s": elapsed,
        "cpu_s": cpu,
        "step_ms": elapsed / steps * 1e3,
        "warmup_steps": done,
        "final_loss": final_loss,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--presets", default=",".join(PRESETS))
    parser.add_argument("--batches", default="",
                        help="default 16,64 (mf: 64,1024)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--min-time", type=float, default=2.0)
    parser.add_argument("--counts-only", action="store_true",
                        help="parameter counts only (no torch needed)")
    args = parser.parse_args()
    presets = [p for p in args.presets.split(",") if p]
    for preset in presets:
        if preset not in PRESETS:
            parser.error(f"unknown preset {preset!r} (one of "
                         f"{', '.join(PRESETS)})")
    batches = [int(b) for b in args.batches.split(",") if b]
    if args.counts_only:
        for preset in presets:
            print(f"{preset:14s} {parameter_count(preset):8d} parameters  "
                  f"{describe(preset)}")
        return 0
    require_torch(__file__, sys.argv[1:])
    set_threads(args.threads)
    info = torch_info()
    print(f"torch {info['torch_version']} ({info['python']}), mkldnn "
          f"available {info['mkldnn_available']} enabled "
          f"{info['mkldnn_enabled']}, {info['intra_op_threads']} intra-op / "
          f"{info['interop_threads']} inter-op threads")
    for preset in presets:
        print(f"{preset:14s} {parameter_count(preset):8d} parameters  "
              f"{describe(preset)}", flush=True)
        unit = "ratings/s" if preset == "mf" else "samples/s"
        for batch in batches or default_batches(preset):
            for variant in variants(preset):
                m = measure(preset, batch, args.min_time, variant=variant)
                name = f" {variant:6s}" if variant else ""
                print(f"  batch {batch:4d}{name}: {m['samples_per_s']:10.0f} "
                      f"{unit}  ({m['step_ms']:.3f} ms/step, {m['steps']} "
                      "steps)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
