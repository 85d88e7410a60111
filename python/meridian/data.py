"""Fashion-MNIST-style data of a job (data { } of the job file) for
PyTorch programs: a worker's share of the training set
(fashion_mnist_shard), the validation set (fashion_mnist_validation) and a
fixed sample of a site's share (fashion_mnist_training_sample), as
torch TensorDatasets.

A worker's share is exactly what the C++ worker of its slot loads
(src/train/dataset.cc, idx.cc, partition.cc; docs/worker-protocol.md
"Data"): the same samples, in the same (sorted) order, with bit-identical
float32 features. Only the minibatch order differs (the C++ worker shuffles
with std::shuffle, which the C++ standard leaves implementation-defined).

  raw IDX files (gzip or plain) -> train_limit -> pixel statistics of the
  (limited) training images -> site partition (data.site_partition over
  all sites, in file order, seeded with job.seed) -> IID split of the
  site's share over its workers (seeded with Mix(seed ^ Mix(site + 1)))
  -> normalisation through a 256-entry float32 table.

The partitioners draw from std::mt19937_64, whose output the C++ standard
fixes; MT19937_64 below reproduces it (10000th output of the default seed
5489: 9981545732273789042), with the same bounded, normal and gamma draws
(DIRICHLET also uses log and exp: the C library's, through Python's math
module, so a Python worker and the C++ processes of one machine agree).
"""

import gzip
import math
import os
from typing import List, Mapping, Optional, Tuple, Union

import numpy as np

_MASK64 = (1 << 64) - 1
_IMAGES_MAGIC = 0x00000803
_LABELS_MAGIC = 0x00000801
_DEFAULT_NUM_CLASSES = 10


class MT19937_64:
    """std::mt19937_64: 64-bit Mersenne Twister, vectorised with numpy
    (one twist of the 312-word state per 312 outputs)."""

    _N, _M = 312, 156
    _MATRIX_A = np.uint64(0xB5026F5AA96619E9)
    _UPPER = np.uint64(0xFFFFFFFF80000000)
    _LOWER = np.uint64(0x7FFFFFFF)

    def __init__(self, seed: int):
        state = [seed & _MASK64]
        for i in range(1, self._N):
            prev = state[-1]
            state.append((6364136223846793005 * (prev ^ (prev >> 62)) + i) &
                         _MASK64)
        self._mt = np.array(state, dtype=np.uint64)
        self._out: List[int] = []
        self._pos = 0

    def _mix(self, upper, lower):
        x = (upper & self._UPPER) | (lower & self._LOWER)
        xa = x >> np.uint64(1)
        odd = (x & np.uint64(1)).astype(bool)
        xa[odd] ^= self._MATRIX_A
        return xa

    def _twist(self) -> None:
        mt, n, m = self._mt, self._N, self._M
        # i in [0, n-m): the old words i, i+1 and i+m.
        mt[:n - m] = mt[m:] ^ self._mix(mt[:n - m], mt[1:n - m + 1])
        # i in [n-m, n-1): word i-(n-m) is already new.
        mt[n - m:n - 1] = mt[:m - 1] ^ self._mix(mt[n - m:n - 1],
                                                 mt[n - m + 1:])
        # i = n-1 wraps to the new word 0.
        mt[n - 1:] = mt[m - 1:m] ^ self._mix(mt[n - 1:], mt[:1])
        y = mt.copy()
        y ^= (y >> np.uint64(29)) & np.uint64(0x5555555555555555)
        y ^= (y << np.uint64(17)) & np.uint64(0x71D67FFFEDA60000)
        y ^= (y << np.uint64(37)) & np.uint64(0xFFF7EEE000000000)
        y ^= y >> np.uint64(43)
        self._out = [int(v) for v in y]
        self._pos = 0

    def __call__(self) -> int:
        if self._pos >= len(self._out):
            self._twist()
        value = self._out[self._pos]
        self._pos += 1
        return value


def uniform_below(rng: MT19937_64, bound: int) -> int:
    """Uniform integer in [0, bound) without modulo bias (UniformBelow)."""
    threshold = ((1 << 64) - bound) % bound
    while True:
        r = rng()
        if r >= threshold:
            return r % bound


def uniform_unit(rng: MT19937_64) -> float:
    """Uniform double in [0, 1) from 53 random bits (UniformUnit)."""
    return (rng() >> 11) * 2.0 ** -53


def mix(x: int) -> int:
    """SplitMix64's finaliser (Mix in dataset.cc)."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def standard_normal(rng: MT19937_64) -> float:
    """Marsaglia's polar method, the second value dropped (StandardNormal
    in src/train/random_draws.h)."""
    while True:
        u = 2 * uniform_unit(rng) - 1
        v = 2 * uniform_unit(rng) - 1
        s = u * u + v * v
        if 0 < s < 1:
            return u * math.sqrt(-2 * math.log(s) / s)


def log_gamma(rng: MT19937_64, shape: float) -> float:
    """log of a Gamma(shape, 1) draw: Marsaglia and Tsang, boosted below
    shape 1 in the log domain (LogGamma in src/train/partition.cc)."""
    if shape < 1:
        boosted = log_gamma(rng, shape + 1)
        u = 1 - uniform_unit(rng)
        return boosted + math.log(u) / shape
    d = shape - 1.0 / 3.0
    c = 1 / math.sqrt(9 * d)
    while True:
        x = standard_normal(rng)
        v = 1 + c * x
        if v <= 0:
            continue
        v = v * v * v
        u = uniform_unit(rng)
        x2 = x * x
        if (u < 1 - 0.0331 * x2 * x2 or
                math.log(u) < 0.5 * x2 + d * (1 - v + math.log(v))):
            return math.log(d) + math.log(v)


def _dirichlet_shares(rng: MT19937_64, alpha: float,
                      num_parts: int) -> List[float]:
    logs = [log_gamma(rng, alpha) for _ in range(num_parts)]
    top = max(logs)
    shares = [1.0 if value == top else math.exp(value - top)
              for value in logs]
    total = 0.0
    for share in shares:  # the C++ summation order
        total += share
    return [share / total for share in shares]


def _round_half_away(x: float) -> float:
    """std::round for x >= 0 (exact: no x + 0.5 rounding)."""
    floor = math.floor(x)
    return floor + 1.0 if x - floor >= 0.5 else float(floor)


# ---- IDX files ---------------------------------------------------------
def _read_maybe_gzip(path: str) -> bytes:
    with open(path, "rb") as f:
        data = f.read()
    if data[:2] == b"\x1f\x8b":  # gzread reads gzip and plain files alike
        data = gzip.decompress(data)
    return data


def read_idx_images(path: str) -> np.ndarray:
    """An IDX3 ubyte image file as uint8 [count, rows, cols]. ValueError on
    a wrong magic number or a size that disagrees with the header."""
    data = _read_maybe_gzip(path)
    header = np.frombuffer(data[:16], dtype=">u4")
    if len(header) < 4 or header[0] != _IMAGES_MAGIC:
        raise ValueError("%s: not an IDX3 image file" % path)
    count, rows, cols = (int(v) for v in header[1:4])
    body = np.frombuffer(data, dtype=np.uint8, offset=16)
    if body.size != count * rows * cols:
        raise ValueError("%s: %d pixel bytes, the header says %d" %
                         (path, body.size, count * rows * cols))
    return body.reshape(count, rows, cols)


def read_idx_labels(path: str) -> np.ndarray:
    """An IDX1 ubyte label file as uint8 [count]."""
    data = _read_maybe_gzip(path)
    header = np.frombuffer(data[:8], dtype=">u4")
    if len(header) < 2 or header[0] != _LABELS_MAGIC:
        raise ValueError("%s: not an IDX1 label file" % path)
    body = np.frombuffer(data, dtype=np.uint8, offset=8)
    if body.size != int(header[1]):
        raise ValueError("%s: %d labels, the header says %d" %
                         (path, body.size, int(header[1])))
    return body


# ---- normalisation -----------------------------------------------------
def pixel_stats(images: np.ndarray) -> Tuple[np.float32, np.float32]:
    """(mean, stddev) of all pixels scaled to [0, 1], population stddev,
    computed in double from a histogram and rounded to float32; stddev 1
    for constant images (ComputePixelStats)."""
    if images.size == 0:
        return np.float32(0), np.float32(1)
    histogram = np.bincount(images.reshape(-1), minlength=256).astype(
        np.float64)
    values = np.arange(256, dtype=np.float64) / 255.0
    total = float(images.size)
    # The same summation order as the C++ loop over v = 0..255.
    mean = 0.0
    for v in range(256):
        mean += values[v] * histogram[v]
    mean /= total
    squares = 0.0
    for v in range(256):
        d = values[v] - mean
        squares += d * d * histogram[v]
    stddev = math.sqrt(squares / total)
    return (np.float32(mean),
            np.float32(stddev) if stddev > 1e-6 else np.float32(1.0))


def normalization_table(normalization: int, mean: np.float32,
                        stddev: np.float32) -> np.ndarray:
    """float32[256]: pixel value -> feature. SCALE (1): v / 255;
    STANDARDIZE (2) and unset: (v / 255 - mean) * (1 / stddev), every
    operation in float32 as MakeDataset does."""
    scaled = np.arange(256, dtype=np.float32) / np.float32(255.0)
    if normalization == 1:  # SCALE
        return scaled
    inv = np.float32(1.0) / stddev if stddev != 0 else np.float32(1.0)
    return (scaled - np.float32(mean)) * inv


# ---- partitions --------------------------------------------------------
def _iid(num_samples: int, num_parts: int, seed: int) -> List[np.ndarray]:
    order = list(range(num_samples))
    rng = MT19937_64(seed)
    for i in range(num_samples, 1, -1):  # Fisher-Yates
        j = uniform_below(rng, i)
        order[i - 1], order[j] = order[j], order[i - 1]
    order = np.array(order, dtype=np.int64)
    # Round-robin deal, each part sorted.
    return [np.sort(order[p::num_parts]) for p in range(num_parts)]


def _label_subset(labels: np.ndarray, num_classes: int, num_parts: int,
                  config) -> List[np.ndarray]:
    owners = [[] for _ in range(num_classes)]
    if len(config.classes) == 0:
        for c in range(num_classes):
            owners[c].append(c % num_parts)
    else:
        if len(config.classes) != num_parts:
            raise ValueError("LABEL_SUBSET lists classes for %d partitions, "
                             "there are %d" % (len(config.classes),
                                               num_parts))
        for p, class_list in enumerate(config.classes):
            if len(class_list.label) == 0:
                raise ValueError("LABEL_SUBSET class list %d is empty" % p)
            for label in class_list.label:
                if label >= num_classes:
                    raise ValueError("LABEL_SUBSET names class %d" % label)
                if not owners[label] or owners[label][-1] != p:
                    owners[label].append(p)
    parts = [[] for _ in range(num_parts)]
    seen = [0] * num_classes
    for i, label in enumerate(labels.tolist()):
        holders = owners[label]
        if not holders:
            continue
        parts[holders[seen[label] % len(holders)]].append(i)
        seen[label] += 1
    return [np.array(p, dtype=np.int64) for p in parts]


def _label_skew(labels: np.ndarray, num_parts: int, skew: float,
                seed: int) -> List[np.ndarray]:
    if not 0.0 <= skew <= 1.0:
        raise ValueError("LABEL_SKEW skew must be in [0, 1], got %r" % skew)
    rng = MT19937_64(seed)
    parts = [[] for _ in range(num_parts)]
    for i, label in enumerate(labels.tolist()):
        home = uniform_unit(rng) < skew
        part = label % num_parts if home else uniform_below(rng, num_parts)
        parts[part].append(i)
    return [np.array(p, dtype=np.int64) for p in parts]


def partition_indices(labels: np.ndarray, num_classes: int, num_parts: int,
                      config, seed: int) -> List[np.ndarray]:
    """Splits [0, len(labels)) into num_parts partitions as
    pb.PartitionConfig `config` says (IID when unset), deterministic in
    `seed` (PartitionIndices)."""
    if not 1 <= num_parts <= 1 << 20:
        raise ValueError("cannot split samples into %d partitions" %
                         num_parts)
    if labels.size and int(labels.max()) >= num_classes:
        raise ValueError("a label is outside [0, %d)" % num_classes)
    kind = config.kind if config is not None else 1
    if kind == 2:  # LABEL_SUBSET
        return _label_subset(labels, num_classes, num_parts, config)
    if kind == 3:  # LABEL_SKEW
        return _label_skew(labels, num_parts, config.skew, seed)
    if kind == 5:  # CLASSES_PER_PART
        return _classes_per_part(labels, num_classes, num_parts,
                                 config.classes_per_part)
    if kind == 4:  # DIRICHLET
        return _dirichlet(labels, num_classes, num_parts, config.alpha,
                          config.min_samples, seed)
    if kind in (0, 1):  # IID, unspecified
        return _iid(int(labels.size), num_parts, seed)
    # A later kind is unknown here: training on other samples than a C++
    # worker in this slot would be silently wrong.
    raise ValueError("site partition kind %d is not supported by the Python "
                     "package; run a C++ `meridian worker` for this job" %
                     kind)


def _dirichlet(labels: np.ndarray, num_classes: int, num_parts: int,
               alpha: float, min_samples: int,
               seed: int) -> List[np.ndarray]:
    """DIRICHLET (Dirichlet in src/train/partition.cc): each class's
    samples shuffled once, then cut by Dirichlet(alpha) shares, drawn again
    (up to 1000 times) until every part has min_samples."""
    max_draws = 1000
    if not (math.isfinite(alpha) and alpha > 0):
        raise ValueError("DIRICHLET alpha must be finite and > 0, got %g" %
                         alpha)
    if labels.size < num_parts * min_samples:
        raise ValueError("DIRICHLET min_samples %d in each of %d partitions "
                         "needs %d samples, but there are %d; lower "
                         "min_samples" % (min_samples, num_parts,
                                          num_parts * min_samples,
                                          labels.size))
    rng = MT19937_64(seed)
    by_class: List[List[int]] = [[] for _ in range(num_classes)]
    for i, label in enumerate(labels.tolist()):
        by_class[label].append(i)
    for samples in by_class:
        for i in range(len(samples), 1, -1):
            j = uniform_below(rng, i)
            samples[i - 1], samples[j] = samples[j], samples[i - 1]
    for _ in range(max_draws):
        totals = [0] * num_parts
        ends = []
        for c in range(num_classes):
            shares = _dirichlet_shares(rng, alpha, num_parts)
            n = len(by_class[c])
            cumulative = 0.0
            begin = 0
            class_ends = []
            for p in range(num_parts):
                cumulative += shares[p]
                end = n
                if p + 1 < num_parts:
                    cut = _round_half_away(cumulative * float(n))
                    end = min(max(int(max(cut, 0.0)), begin), n)
                class_ends.append(end)
                totals[p] += end - begin
                begin = end
            ends.append(class_ends)
        if min(totals) < min_samples:
            continue
        parts: List[List[int]] = [[] for _ in range(num_parts)]
        for c in range(num_classes):
            begin = 0
            for p in range(num_parts):
                parts[p].extend(by_class[c][begin:ends[c][p]])
                begin = ends[c][p]
        return [np.array(sorted(part), dtype=np.int64) for part in parts]
    raise ValueError("DIRICHLET alpha %g left some of the %d partitions with "
                     "fewer than min_samples %d samples in each of %d draws; "
                     "raise alpha or lower min_samples" %
                     (alpha, num_parts, min_samples, max_draws))


def _classes_per_part(labels: np.ndarray, num_classes: int, num_parts: int,
                      k: int) -> List[np.ndarray]:
    """CLASSES_PER_PART: partition p holds classes (p*k + j) mod C, j < k,
    dealt as LABEL_SUBSET deals them (ClassesOfPartition)."""
    if not 1 <= k <= num_classes:
        raise ValueError("CLASSES_PER_PART classes_per_part must be in "
                         "[1, %d], got %d" % (num_classes, k))
    if k * num_parts < num_classes:
        raise ValueError("CLASSES_PER_PART classes_per_part %d over %d "
                         "partitions leaves classes without one" %
                         (k, num_parts))
    subset = _ClassLists([sorted({(p * k + j) % num_classes
                                  for j in range(k)})
                          for p in range(num_parts)])
    return _label_subset(labels, num_classes, num_parts, subset)


class _ClassLists:
    """The part of a pb.PartitionConfig _label_subset reads."""

    class _List:
        def __init__(self, labels):
            self.label = labels

    def __init__(self, lists):
        self.classes = [self._List(labels) for labels in lists]


def site_worker_count(site) -> int:
    """Workers of a pb.SiteConfig (the sum of its groups' counts)."""
    return sum(group.count for group in site.workers)


def worker_group(site, index: int):
    """The pb.WorkerGroup worker `index` of `site` belongs to
    (WorkerGroupOf)."""
    for group in site.workers:
        if index < group.count:
            return group
        index -= group.count
    return site.workers[len(site.workers) - 1]


def worker_sample_indices(job, train_labels: np.ndarray, site_index: int,
                          worker_index: int) -> np.ndarray:
    """The training-set indices of one worker, sorted
    (WorkerSampleIndices)."""
    num_sites = len(job.site)
    if not 0 <= site_index < num_sites:
        raise IndexError("site index %d outside [0, %d)" %
                         (site_index, num_sites))
    num_workers = site_worker_count(job.site[site_index])
    if not 0 <= worker_index < num_workers:
        raise IndexError("worker index %d outside [0, %d) for site '%s'" %
                         (worker_index, num_workers,
                          job.site[site_index].name))
    num_classes = max(_DEFAULT_NUM_CLASSES,
                      int(train_labels.max()) + 1 if train_labels.size else 0)
    sites = partition_indices(train_labels, num_classes, num_sites,
                              job.data.site_partition, job.seed)
    share = sites[site_index]
    worker_seed = mix(job.seed ^ mix(site_index + 1))
    workers = partition_indices(train_labels[share], num_classes,
                                num_workers, None, worker_seed)
    return share[workers[worker_index]]


def _training_set(job):
    """The job's (limited) training images [n, rows, cols], labels and
    the normalisation table from their statistics."""
    data = job.data
    images = read_idx_images(os.path.join(data.dir, data.train_images))
    labels = read_idx_labels(os.path.join(data.dir, data.train_labels))
    if images.shape[0] != labels.size:
        raise ValueError("%s holds %d samples but %s holds %d labels" %
                         (data.train_images, images.shape[0],
                          data.train_labels, labels.size))
    if data.train_limit:
        images = images[:data.train_limit]
        labels = labels[:data.train_limit]
    mean, stddev = pixel_stats(images)
    return images, labels, normalization_table(data.normalization, mean,
                                               stddev)


def load_worker_data(job, site_index: int,
                     worker_index: int) -> Tuple[np.ndarray, np.ndarray]:
    """The worker's training samples: (features float32 [n, rows*cols],
    labels uint8 [n]), as Worker::Create loads them."""
    images, labels, table = _training_set(job)
    indices = worker_sample_indices(job, labels, site_index, worker_index)
    flat = images.reshape(images.shape[0], -1)
    return table[flat[indices]], labels[indices].copy()


def input_dim(job) -> int:
    """rows * cols of the job's training images (reads the header only)."""
    path = os.path.join(job.data.dir, job.data.train_images)
    opener = gzip.open if _is_gzip(path) else open
    with opener(path, "rb") as f:
        header = np.frombuffer(f.read(16), dtype=">u4")
    return int(header[2]) * int(header[3])


def _is_gzip(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


# ---- torch datasets ----------------------------------------------------
JobLike = Union[None, str, "os.PathLike[str]", object]


def _job_and_env(job: JobLike, environ: Optional[Mapping[str, str]]):
    """(pb.JobConfig, Environment): `job` a JobConfig, a path, or None for
    $MERIDIAN_JOB."""
    from .environment import environment, load_job
    env = environment(environ)
    if job is None:
        if env.job is None:
            raise ValueError("no job file: pass job= or set MERIDIAN_JOB")
        job = env.job
    if isinstance(job, (str, os.PathLike)):
        job = load_job(job)
    return job, env


def _site_of(job, env, site: Union[None, str, int]) -> int:
    from .environment import site_index
    if isinstance(site, int):
        return site
    if site is not None:
        return site_index(job, site)
    if env.site is not None:
        return site_index(job, env.site)
    if env.site_index is not None:
        return env.site_index
    if len(job.site) == 1:
        return 0
    raise ValueError("which site? pass site= or set MERIDIAN_SITE")


def _as_dataset(features: np.ndarray, labels: np.ndarray, rows: int,
                cols: int):
    import torch
    from torch.utils.data import TensorDataset
    images = torch.from_numpy(np.ascontiguousarray(features, np.float32))
    return TensorDataset(images.reshape(-1, 1, rows, cols),
                         torch.from_numpy(labels.astype(np.int64)))


def fashion_mnist_shard(job: JobLike = None,
                        site: Union[None, str, int] = None,
                        worker: Optional[int] = None,
                        environ: Optional[Mapping[str, str]] = None):
    """This worker's share of the job's training set as a
    torch.utils.data.TensorDataset of (image float32 [1, rows, cols],
    label int64): the samples and features the C++ worker of its slot
    trains on (site partition, IID split inside the site, normalisation
    of data { }). `job`: a pb.JobConfig or a job file's path (default
    $MERIDIAN_JOB); `site`: a name or index (default $MERIDIAN_SITE, or
    the only site); `worker`: the index inside the site (default
    $MERIDIAN_WORKER_INDEX). ValueError when the share is empty."""
    job, env = _job_and_env(job, environ)
    s = _site_of(job, env, site)
    if worker is None:
        worker = env.worker_index
    if worker is None:
        raise ValueError("which worker? pass worker= or set "
                         "MERIDIAN_WORKER_INDEX")
    images, labels, table = _training_set(job)
    indices = worker_sample_indices(job, labels, s, worker)
    if indices.size == 0:
        raise ValueError("worker %d of site '%s' has no training samples "
                         "(partition too small)" % (worker, job.site[s].name))
    rows, cols = images.shape[1:]
    flat = images.reshape(images.shape[0], -1)
    return _as_dataset(table[flat[indices]], labels[indices], rows, cols)


def fashion_mnist_validation(job: JobLike = None,
                             environ: Optional[Mapping[str, str]] = None):
    """The job's validation set: the test images and labels of data { }
    (data.test_limit of them; all when 0), normalised with the training
    set's statistics as the site servers do, as a TensorDataset of (image
    float32 [1, rows, cols], label int64)."""
    job, _ = _job_and_env(job, environ)
    data = job.data
    images = read_idx_images(os.path.join(data.dir, data.test_images))
    labels = read_idx_labels(os.path.join(data.dir, data.test_labels))
    if data.test_limit:
        images = images[:data.test_limit]
        labels = labels[:data.test_limit]
    _, _, table = _training_set(job)
    rows, cols = images.shape[1:]
    return _as_dataset(table[images.reshape(images.shape[0], -1)], labels,
                       rows, cols)


def fashion_mnist_training_sample(job: JobLike = None,
                                  site: Union[None, str, int] = None,
                                  samples: int = 2000,
                                  environ: Optional[Mapping[str, str]] = None):
    """A fixed sample of `samples` examples (all when fewer) of a site's
    share of the training set, the same on every call for the same job
    seed and site: what an evaluator scores for TRAINING_SAMPLE tasks
    (the intra-site policy's loss evaluations, SkewScout's comparisons).
    It is drawn with numpy's generator seeded with the job's seed and the
    site's index, not the C++ server's own sample (which uses the
    implementation-defined std::shuffle)."""
    job, env = _job_and_env(job, environ)
    s = _site_of(job, env, site)
    images, labels, table = _training_set(job)
    num_classes = max(_DEFAULT_NUM_CLASSES,
                      int(labels.max()) + 1 if labels.size else 0)
    share = partition_indices(labels, num_classes, len(job.site),
                              job.data.site_partition, job.seed)[s]
    rng = np.random.default_rng([job.seed, s, 0x6c6f7373])  # "loss"
    if share.size > samples:
        share = np.sort(rng.choice(share, size=samples, replace=False))
    rows, cols = images.shape[1:]
    flat = images.reshape(images.shape[0], -1)
    return _as_dataset(table[flat[share]], labels[share], rows, cols)
