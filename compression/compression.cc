// UpdateEncoder, UpdateDecoder and the header format (see
// include/meridian/compression.h). The stages live in selection.cc,
// index_coding.cc and value_coding.cc; this file chooses between them,
// lays out the buffer, runs zstd and keeps the error-feedback books.

#include "meridian/compression/compression.h"

#include <zstd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <numeric>
#include <string>
#include <utility>

#include "format.h"
#include "index_coding.h"
#include "selection.h"
#include "value_coding.h"
#include "varint.h"

namespace meridian {
namespace {

using compression::kFixedHeaderBytes;

// Streams of the per-call generator (see RoundingKey).
constexpr uint64_t kRoundingStream = 1;
constexpr uint64_t kSampleStream = 2;

// TOP_K_SAMPLED: about this many non-zero magnitudes estimate the
// threshold; inputs with fewer than kSampleMinCandidates candidates take
// the exact path (cheap at that size, and a sample would not be smaller).
constexpr size_t kSampleTarget = 4096;
constexpr size_t kSampleMinCandidates = 16 * kSampleTarget;
// The sampled threshold aims this much above k, so that the result is
// usually trimmed to exactly k rather than falling short of it.
constexpr double kSampleOvershoot = 1.05;

// Grows `v` to at least n elements (never shrinks, so that steady-state
// calls neither allocate nor re-initialise) and returns its data.
template <typename T>
T* Grow(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

// Grow for sizes a decoded header asks for: bounded by the caller's limit,
// but an allocation failure becomes a Status rather than an exception.
template <typename T>
Status GrowForDecode(std::vector<T>& v, uint64_t n, T** data) {
  try {
    if (v.size() < n) v.resize(static_cast<size_t>(n));
  } catch (const std::exception& e) {  // bad_alloc, length_error
    return OutOfRangeError("cannot allocate " + std::to_string(n) +
                           " decoded elements: " + e.what());
  }
  *data = v.data();
  return Status::Ok();
}

bool Overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto pa = reinterpret_cast<uintptr_t>(a);
  const auto pb = reinterpret_cast<uintptr_t>(b);
  return pa < pb + b_bytes && pb < pa + a_bytes;
}

// The first non-finite value, for the error message (error path only).
size_t FirstNonFinite(std::span<const float> values) {
  for (size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) return i;
  }
  return values.size();
}

std::string Percent(double fraction) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%g%%", fraction * 100);
  return buffer;
}

// k of a top-k selection over a slice of `size` elements.
uint64_t TopK(double fraction, uint64_t size) {
  // The small subtraction keeps binary fractions such as 0.01 * 1e6 from
  // rounding up to k + 1.
  const double k = std::ceil(fraction * static_cast<double>(size) - 1e-6);
  if (k < 1) return std::min<uint64_t>(1, size);
  return std::min(size, static_cast<uint64_t>(k));
}

struct ZstdCCtxDeleter {
  void operator()(ZSTD_CCtx* c) const { ZSTD_freeCCtx(c); }
};
struct ZstdDCtxDeleter {
  void operator()(ZSTD_DCtx* d) const { ZSTD_freeDCtx(d); }
};

uint8_t CodingsByte(pb::ValueCoding value, pb::IndexCoding index, bool zstd) {
  return static_cast<uint8_t>(
      static_cast<uint8_t>(value) |
      (static_cast<uint8_t>(index) << compression::kIndexCodingShift) |
      (zstd ? compression::kZstdBit : 0));
}

}  // namespace

// ---- configuration ----------------------------------------------------------

Status ValidateCompressionConfig(const pb::CompressionConfig& config) {
  if (config.selection() == pb::SELECTION_KIND_UNSPECIFIED ||
      !pb::SelectionKind_IsValid(config.selection())) {
    return InvalidArgumentError("compression.selection: unknown kind " +
                                std::to_string(config.selection()) +
                                " (SELECT_ALL, TOP_K, TOP_K_SAMPLED)");
  }
  if (config.selection() != pb::SELECT_ALL &&
      !(config.top_k_fraction() > 0.0 && config.top_k_fraction() <= 1.0)) {
    return InvalidArgumentError("compression.top_k_fraction: " +
                                std::to_string(config.top_k_fraction()) +
                                " is not in (0, 1]");
  }
  if (config.index_coding() == pb::INDEX_CODING_UNSPECIFIED ||
      !pb::IndexCoding_IsValid(config.index_coding())) {
    return InvalidArgumentError(
        "compression.index_coding: unknown coding " +
        std::to_string(config.index_coding()) +
        " (INDEX_AUTO, INDEX_DELTA_VARINT, INDEX_BITMAP, INDEX_DENSE)");
  }
  if (config.value_coding() == pb::VALUE_CODING_UNSPECIFIED ||
      !pb::ValueCoding_IsValid(config.value_coding())) {
    return InvalidArgumentError(
        "compression.value_coding: unknown coding " +
        std::to_string(config.value_coding()) +
        " (VALUE_FP32, VALUE_FP16, VALUE_BF16, VALUE_INT8, VALUE_INT4, "
        "VALUE_INT2)");
  }
  if (config.index_coding() == pb::INDEX_DENSE &&
      !compression::HasZeroLevel(config.value_coding())) {
    return InvalidArgumentError(
        "compression.index_coding: INDEX_DENSE with VALUE_INT2, which has no "
        "zero level, would send every unselected element as +-s/3; use "
        "INDEX_AUTO, INDEX_DELTA_VARINT or INDEX_BITMAP");
  }
  if (config.block_size() < 1 ||
      config.block_size() > kMaxCompressionBlockSize) {
    return InvalidArgumentError(
        "compression.block_size: " + std::to_string(config.block_size()) +
        " is not in [1, " + std::to_string(kMaxCompressionBlockSize) + "]");
  }
  if (config.rounding() == pb::ROUNDING_UNSPECIFIED ||
      !pb::Rounding_IsValid(config.rounding())) {
    return InvalidArgumentError("compression.rounding: unknown rounding " +
                                std::to_string(config.rounding()) +
                                " (ROUND_NEAREST, ROUND_STOCHASTIC)");
  }
  if (config.zstd_level() != 0 && (config.zstd_level() < ZSTD_minCLevel() ||
                                   config.zstd_level() > ZSTD_maxCLevel())) {
    return InvalidArgumentError(
        "compression.zstd_level: " + std::to_string(config.zstd_level()) +
        " is not 0 (no zstd) or in [" + std::to_string(ZSTD_minCLevel()) +
        ", " + std::to_string(ZSTD_maxCLevel()) + "]");
  }
  return Status::Ok();
}

std::string DescribeCompressionConfig(const pb::CompressionConfig& config) {
  std::string text;
  switch (config.selection()) {
    case pb::SELECT_ALL:
      text = "all";
      break;
    case pb::TOP_K:
      text = "top-k " + Percent(config.top_k_fraction()) + " exact";
      break;
    case pb::TOP_K_SAMPLED:
      text = "top-k " + Percent(config.top_k_fraction()) + " sampled";
      break;
    default:
      text = "?";
  }
  switch (config.index_coding()) {
    case pb::INDEX_AUTO:
      text += " + auto-index";
      break;
    case pb::INDEX_DELTA_VARINT:
      text += " + delta-varint";
      break;
    case pb::INDEX_BITMAP:
      text += " + bitmap";
      break;
    case pb::INDEX_DENSE:
      text += " + dense";
      break;
    default:
      text += " + ?";
  }
  const bool lossy = config.value_coding() != pb::VALUE_FP32;
  switch (config.value_coding()) {
    case pb::VALUE_FP32:
      text += " + fp32";
      break;
    case pb::VALUE_FP16:
      text += " + fp16";
      break;
    case pb::VALUE_BF16:
      text += " + bf16";
      break;
    case pb::VALUE_INT8:
      text += " + int8/" + std::to_string(config.block_size());
      break;
    case pb::VALUE_INT4:
      text += " + int4/" + std::to_string(config.block_size());
      break;
    case pb::VALUE_INT2:
      text += " + int2/" + std::to_string(config.block_size());
      break;
    default:
      text += " + ?";
  }
  if (lossy && config.rounding() == pb::ROUND_STOCHASTIC) text += " stochastic";
  if (config.zstd_level() != 0) {
    text += " + zstd " + std::to_string(config.zstd_level());
  }
  return text;
}

// ---- encoder ----------------------------------------------------------------

struct UpdateEncoder::State {
  pb::CompressionConfig config;
  std::unique_ptr<ZSTD_CCtx, ZstdCCtxDeleter> cctx;  // null without zstd
  uint64_t calls = 0;  // advances the seeded streams

  // Scratch, grown on demand and never shrunk.
  std::vector<uint32_t> positions;  // selected entries: input positions
  std::vector<uint32_t> indices;    // ... and their slice indices
  std::vector<float> values;        // ... and values
  std::vector<uint32_t> abs_bits;   // magnitudes for top-k thresholds
  std::vector<uint32_t> refine_positions;
  std::vector<float> refine_values;
  std::vector<float> residuals;  // per selected entry
  std::vector<float> dense;      // INDEX_DENSE of a partial selection
  std::vector<std::byte> body;   // body before zstd
  std::vector<std::byte> out;    // [room for the header][body]

  // The key of stream `stream` for the current call.
  uint64_t Key(uint64_t stream) const {
    return compression::Mix64(config.rounding_seed() ^
                              compression::Mix64(calls * 4 + stream));
  }

  // What a message's entries are, after selection. `indices`/`values`
  // describe the m selected entries in slice order; `slots[j]` is where
  // entry j's residual goes in the caller's residual span (null: j).
  struct Selected {
    size_t m = 0;
    const uint32_t* indices = nullptr;
    const float* values = nullptr;
    const uint32_t* slots = nullptr;
  };

  // The sampled threshold (|v| bits) over candidates[0, n) that keeps about
  // kSampleOvershoot * k of the `candidates` entries with |v| bits >=
  // min_abs_bits; 0 when the sample finds none.
  uint32_t SampledThreshold(const float* x, size_t n, uint32_t min_abs_bits,
                            uint64_t candidates, uint64_t k) {
    const uint64_t draws = std::min<uint64_t>(
        n, (kSampleTarget * static_cast<uint64_t>(n) + candidates - 1) /
               candidates);
    const uint64_t stride = n / draws;
    uint32_t* sample = Grow(abs_bits, draws);
    size_t found = 0;
    const uint64_t key = Key(kSampleStream);
    for (uint64_t d = 0; d < draws; ++d) {
      const uint64_t i = d * stride + compression::RandomAt(key, d) % stride;
      const uint32_t a = compression::AbsBitsOf(x[i]);
      if (a >= min_abs_bits) sample[found++] = a;
    }
    if (found == 0) return 0;
    // The rank (from the top) whose share of the sample matches the share
    // of k (with overshoot) among the candidates.
    const double share = kSampleOvershoot * static_cast<double>(k) /
                         static_cast<double>(candidates);
    const size_t above =
        std::min<size_t>(found, static_cast<size_t>(std::ceil(share * found)));
    const size_t cut = found - std::max<size_t>(above, 1);
    std::nth_element(sample, sample + cut, sample + found);
    return sample[cut];
  }

  // Selects the top k of x[0, n) among entries with |v| bits >=
  // min_abs_bits (`candidates` of them, k < candidates) into positions /
  // values; returns how many (k, or fewer with a sampled threshold).
  size_t SelectTopK(const float* x, size_t n, uint32_t min_abs_bits,
                    uint64_t candidates, uint64_t k) {
    uint32_t* pos = Grow(positions, candidates);
    float* val = Grow(values, candidates);
    if (config.selection() == pb::TOP_K_SAMPLED &&
        candidates >= kSampleMinCandidates) {
      const uint32_t t = SampledThreshold(x, n, min_abs_bits, candidates, k);
      if (t > 0 || min_abs_bits == 0) {
        const size_t m = compression::CompactAtLeast(
            x, n, std::max(t, min_abs_bits), pos, val);
        if (m <= k) return m;
        // Too many: the exact top k of the few selected.
        uint32_t* mags = Grow(abs_bits, m);
        for (size_t j = 0; j < m; ++j) mags[j] = compression::AbsBitsOf(val[j]);
        const compression::TopKThreshold exact =
            compression::ExactTopKThreshold(mags, m, k);
        uint32_t* sub = Grow(refine_positions, m);
        float* sub_val = Grow(refine_values, m);
        const size_t kept =
            compression::CompactTopK(val, m, exact, sub, sub_val);
        for (size_t j = 0; j < kept; ++j) {
          pos[j] = pos[sub[j]];  // sub[j] >= j: in place is safe
          val[j] = sub_val[j];
        }
        return kept;
      }
    }
    uint32_t* mags = Grow(abs_bits, candidates);
    const size_t gathered =
        compression::GatherAbsBits(x, n, min_abs_bits, mags);
    const compression::TopKThreshold threshold =
        compression::ExactTopKThreshold(mags, gathered, k);
    return compression::CompactTopK(x, n, threshold, pos, val);
  }

  // The sections of a message: its index coding and their sizes.
  struct BodyLayout {
    pb::IndexCoding coding = pb::INDEX_DENSE;
    uint64_t sent = 0;  // values sent: n (INDEX_DENSE) or the selection's m
    uint64_t index_bytes = 0;
    uint64_t value_bytes = 0;
    uint64_t body_bytes() const { return index_bytes + value_bytes; }
  };

  // The layout of the message of the selected entries of a slice of n
  // elements with the `requested` index coding: forced, or (AUTO) the
  // smallest body (delta-varint's size is computed only when it can win).
  BodyLayout PlanBody(uint64_t n, pb::IndexCoding requested,
                      const Selected& sel) const {
    const pb::ValueCoding value_coding = config.value_coding();
    const uint32_t block = config.block_size();
    const uint64_t bitmap_bytes = compression::BitmapBytes(n);
    const uint64_t dense_value_bytes =
        compression::ValueSectionBytes(value_coding, n, block);
    const uint64_t sparse_value_bytes =
        compression::ValueSectionBytes(value_coding, sel.m, block);

    pb::IndexCoding coding = requested;
    uint64_t delta_bytes = 0;
    if (coding == pb::INDEX_AUTO) {
      // Without a zero level the dense form is exact only when every
      // element is sent.
      const bool dense_ok =
          compression::HasZeroLevel(value_coding) || sel.m == n;
      coding = dense_ok ? pb::INDEX_DENSE : pb::INDEX_BITMAP;
      uint64_t best = dense_ok ? dense_value_bytes
                               : sparse_value_bytes + bitmap_bytes;
      if (sparse_value_bytes + bitmap_bytes < best) {
        coding = pb::INDEX_BITMAP;
        best = sparse_value_bytes + bitmap_bytes;
      }
      if (sparse_value_bytes + sel.m < best) {  // a varint is >= 1 byte
        delta_bytes = compression::DeltaVarintBytes(sel.indices, sel.m);
        if (sparse_value_bytes + delta_bytes < best) {
          coding = pb::INDEX_DELTA_VARINT;
        }
      }
    } else if (coding == pb::INDEX_DELTA_VARINT) {
      delta_bytes = compression::DeltaVarintBytes(sel.indices, sel.m);
    }

    BodyLayout layout;
    layout.coding = coding;
    layout.sent = coding == pb::INDEX_DENSE ? n : sel.m;
    layout.index_bytes = coding == pb::INDEX_DENSE    ? 0
                         : coding == pb::INDEX_BITMAP ? bitmap_bytes
                                                      : delta_bytes;
    layout.value_bytes =
        coding == pb::INDEX_DENSE ? dense_value_bytes : sparse_value_bytes;
    return layout;
  }

  // Writes the value section of the selection (n elements in the slice)
  // at `values_at` and the residual, as Assemble describes them.
  void WriteValues(uint64_t n, pb::IndexCoding coding, const Selected& sel,
                   const float* dense_input, std::span<const float> input,
                   std::span<float> residual, std::byte* values_at) {
    const pb::ValueCoding value_coding = config.value_coding();
    const uint32_t block = config.block_size();
    const compression::RoundingMode rounding{
        config.rounding() == pb::ROUND_STOCHASTIC, Key(kRoundingStream)};
    const bool want_residual = !residual.empty();
    if (coding == pb::INDEX_DENSE && dense_input != nullptr) {
      // The input itself is the value array; its residual is the caller's
      // (possibly in place).
      compression::EncodeValues(value_coding, block, rounding, dense_input, n,
                                values_at,
                                want_residual ? residual.data() : nullptr);
    } else if (coding == pb::INDEX_DENSE) {
      // Scatter the selection into zeros; residuals in place.
      float* d = Grow(dense, n);
      std::fill(d, d + n, 0.0f);
      for (size_t j = 0; j < sel.m; ++j) d[sel.indices[j]] = sel.values[j];
      compression::EncodeValues(value_coding, block, rounding, d, n, values_at,
                                want_residual ? d : nullptr);
      if (want_residual) {
        float* r = Grow(residuals, sel.m);
        for (size_t j = 0; j < sel.m; ++j) r[j] = d[sel.indices[j]];
        ScatterResiduals(sel, r, input, residual);
      }
    } else if (want_residual && sel.slots == nullptr &&
               sel.values == input.data() && sel.m == input.size()) {
      // Every input entry is sent in input order: residuals straight into
      // the caller's span.
      compression::EncodeValues(value_coding, block, rounding, sel.values,
                                sel.m, values_at, residual.data());
    } else {
      float* r = want_residual ? Grow(residuals, sel.m) : nullptr;
      compression::EncodeValues(value_coding, block, rounding, sel.values,
                                sel.m, values_at, r);
      if (want_residual) ScatterResiduals(sel, r, input, residual);
    }
  }

  // Moves the body (in `body`) behind the room for the header in `out`,
  // through zstd when that shrinks it; returns the payload's bytes and
  // sets *zstd when it is compressed. Only with a zstd stage (cctx).
  uint64_t CompressBody(uint64_t body_bytes, bool* zstd) {
    *zstd = false;
    const size_t bound = ZSTD_compressBound(body_bytes);
    std::byte* dst = Grow(out, kMaxCompressionHeaderBytes +
                                   std::max<size_t>(bound, body_bytes)) +
                     kMaxCompressionHeaderBytes;
    const size_t written =
        body_bytes == 0
            ? 0
            : ZSTD_compress2(cctx.get(), dst, bound, body.data(), body_bytes);
    if (body_bytes > 0 && !ZSTD_isError(written) && written < body_bytes) {
      *zstd = true;
      return written;
    }
    if (body_bytes > 0) std::memcpy(dst, body.data(), body_bytes);
    return body_bytes;
  }

  // Writes the header right before the payload in `out` and seals the
  // checksum; returns the whole message.
  std::span<std::byte> SealMessage(uint64_t n, const BodyLayout& layout,
                                   bool zstd, uint64_t payload_bytes) {
    const pb::ValueCoding value_coding = config.value_coding();
    std::byte header[kMaxCompressionHeaderBytes];
    header[0] = compression::kMagic0;
    header[1] = compression::kMagic1;
    header[compression::kVersionOffset] =
        static_cast<std::byte>(kCompressionFormatVersion);
    header[compression::kCodingsOffset] =
        static_cast<std::byte>(CodingsByte(value_coding, layout.coding, zstd));
    std::memset(header + compression::kChecksumOffset, 0, 4);
    std::byte* p = header + kFixedHeaderBytes;
    p = compression::WriteVarint(n, p);
    p = compression::WriteVarint(layout.sent, p);
    if (compression::HasScales(value_coding)) {
      p = compression::WriteVarint(config.block_size(), p);
    }
    if (layout.coding == pb::INDEX_DELTA_VARINT) {
      p = compression::WriteVarint(layout.index_bytes, p);
    }
    const size_t header_bytes = static_cast<size_t>(p - header);
    std::byte* start = out.data() + kMaxCompressionHeaderBytes - header_bytes;
    std::memcpy(start, header, header_bytes);
    const std::span<std::byte> encoded(start, header_bytes + payload_bytes);
    compression::SealChecksum(encoded);
    return encoded;
  }

  // Lays out the message of the selected entries of a slice of n
  // elements with the `requested` index coding (AUTO: the smallest) and
  // writes the residual. `dense_input` is the whole slice
  // when it can serve as the value array of INDEX_DENSE (a dense input of
  // which every non-zero entry is selected), else null. `input` and
  // `residual` are the caller's values and residual span (residual may be
  // empty, or alias input exactly).
  EncodedUpdate Assemble(uint64_t n, pb::IndexCoding requested,
                         const Selected& sel, const float* dense_input,
                         std::span<const float> input,
                         std::span<float> residual) {
    const BodyLayout layout = PlanBody(n, requested, sel);
    const uint64_t body_bytes = layout.body_bytes();
    const bool want_zstd = cctx != nullptr;
    // (Never a null pointer, even for an empty body: the stages memset
    // and memcpy through it.)
    std::byte* body_at =
        want_zstd ? Grow(body, std::max<uint64_t>(body_bytes, 1))
                  : Grow(out, kMaxCompressionHeaderBytes + body_bytes) +
                        kMaxCompressionHeaderBytes;

    // Index section.
    if (layout.coding == pb::INDEX_BITMAP) {
      compression::WriteBitmap(sel.indices, sel.m, n, body_at);
    } else if (layout.coding == pb::INDEX_DELTA_VARINT) {
      compression::WriteDeltaVarint(sel.indices, sel.m, body_at);
    }
    // Value section and residuals.
    WriteValues(n, layout.coding, sel, dense_input, input, residual,
                body_at + layout.index_bytes);
    // zstd, kept only when it shrinks the body.
    bool zstd = false;
    const uint64_t payload_bytes =
        want_zstd ? CompressBody(body_bytes, &zstd) : body_bytes;
    const std::span<std::byte> encoded =
        SealMessage(n, layout, zstd, payload_bytes);

    EncodedUpdate result;
    result.bytes = encoded;
    result.summary.size = n;
    result.summary.selected = sel.m;
    result.summary.sent = layout.sent;
    result.summary.index_coding = layout.coding;
    result.summary.zstd = zstd;
    result.summary.body_bytes = body_bytes;
    result.summary.encoded_bytes = encoded.size();
    return result;
  }

  // residual = input, except the selected entries' slots, which get r[j].
  static void ScatterResiduals(const Selected& sel, const float* r,
                               std::span<const float> input,
                               std::span<float> residual) {
    if (residual.data() != input.data() && !input.empty()) {
      std::memcpy(residual.data(), input.data(), input.size() * sizeof(float));
    }
    if (sel.slots == nullptr) {
      if (sel.m > 0) std::memcpy(residual.data(), r, sel.m * sizeof(float));
    } else {
      for (size_t j = 0; j < sel.m; ++j) residual[sel.slots[j]] = r[j];
    }
  }
};

UpdateEncoder::UpdateEncoder(std::unique_ptr<State> state)
    : state_(std::move(state)) {}
UpdateEncoder::UpdateEncoder(UpdateEncoder&&) noexcept = default;
UpdateEncoder& UpdateEncoder::operator=(UpdateEncoder&&) noexcept = default;
UpdateEncoder::~UpdateEncoder() = default;

Result<UpdateEncoder> UpdateEncoder::Create(
    const pb::CompressionConfig& config) {
  MERIDIAN_RETURN_IF_ERROR(ValidateCompressionConfig(config));
  auto state = std::make_unique<State>();
  state->config = config;
  if (config.zstd_level() != 0) {
    state->cctx.reset(ZSTD_createCCtx());
    if (state->cctx == nullptr) {
      return InternalError("zstd: cannot create a compression context");
    }
    ZSTD_CCtx* c = state->cctx.get();
    for (const auto& [param, value] :
         {std::pair{ZSTD_c_compressionLevel, config.zstd_level()},
          std::pair{ZSTD_c_contentSizeFlag, 1},
          std::pair{ZSTD_c_checksumFlag, 0}}) {
      const size_t r = ZSTD_CCtx_setParameter(c, param, value);
      if (ZSTD_isError(r)) {
        return InternalError(std::string("zstd: ") + ZSTD_getErrorName(r));
      }
    }
  }
  return UpdateEncoder(std::move(state));
}

const pb::CompressionConfig& UpdateEncoder::config() const {
  return state_->config;
}

Status UpdateEncoder::SetTopKFraction(double fraction) {
  const pb::SelectionKind selection = state_->config.selection();
  if (selection != pb::TOP_K && selection != pb::TOP_K_SAMPLED) {
    return InvalidArgumentError(
        "the top-k fraction applies to a TOP_K selection only");
  }
  if (!(fraction > 0.0 && fraction <= 1.0)) {
    return InvalidArgumentError("top-k fraction " + std::to_string(fraction) +
                                " is outside (0, 1]");
  }
  state_->config.set_top_k_fraction(fraction);
  return Status::Ok();
}

Result<EncodedUpdate> UpdateEncoder::EncodeDense(std::span<const float> update,
                                                 std::span<float> residual) {
  State& s = *state_;
  const uint64_t n = update.size();
  if (n > kMaxCompressedSliceElements) {
    return InvalidArgumentError(
        "update of " + std::to_string(n) + " elements: at most " +
        std::to_string(kMaxCompressedSliceElements) + " per slice");
  }
  if (!residual.empty()) {
    if (residual.size() != n) {
      return InvalidArgumentError("residual has " +
                                  std::to_string(residual.size()) +
                                  " elements, the update " + std::to_string(n));
    }
    if (residual.data() != update.data() &&
        Overlap(residual.data(), n * sizeof(float), update.data(),
                n * sizeof(float))) {
      return InvalidArgumentError(
          "residual overlaps the update without being the same span");
    }
  }
  const compression::ScanResult scan =
      compression::ScanValues(update.data(), n);
  if (!scan.finite) {
    const size_t at = FirstNonFinite(update);
    return InvalidArgumentError("update[" + std::to_string(at) + "] is " +
                                std::to_string(update[at]) +
                                ": only finite values can be encoded");
  }
  ++s.calls;

  const uint64_t candidates = scan.nonzero;
  const uint64_t k =
      s.config.selection() == pb::SELECT_ALL
          ? candidates
          : std::min(candidates, TopK(s.config.top_k_fraction(), n));
  const bool all_nonzero = k == candidates;

  // Fast path: every non-zero entry is sent and the dense form is at
  // least as small as any indexed one (a varint index costs >= 1 byte):
  // no compaction at all.
  if (all_nonzero) {
    const pb::ValueCoding vc = s.config.value_coding();
    const uint32_t block = s.config.block_size();
    const uint64_t dense_bytes = compression::ValueSectionBytes(vc, n, block);
    const uint64_t sparse_bytes =
        compression::ValueSectionBytes(vc, candidates, block);
    const pb::IndexCoding ic = s.config.index_coding();
    if (ic == pb::INDEX_DENSE ||
        (ic == pb::INDEX_AUTO &&
         (compression::HasZeroLevel(vc) || candidates == n) &&
         dense_bytes <=
             sparse_bytes +
                 std::min<uint64_t>(compression::BitmapBytes(n), candidates))) {
      State::Selected all;  // no indices: the dense form does not need them
      all.m = candidates;
      return s.Assemble(n, pb::INDEX_DENSE, all, update.data(), update,
                        residual);
    }
  }

  State::Selected sel;
  if (all_nonzero) {
    uint32_t* pos = Grow(s.positions, candidates);
    float* val = Grow(s.values, candidates);
    sel.m = compression::CompactAtLeast(update.data(), n, 1, pos, val);
  } else {
    sel.m = s.SelectTopK(update.data(), n, 1, candidates, k);
  }
  sel.indices = s.positions.data();
  sel.values = s.values.data();
  sel.slots = s.positions.data();
  return s.Assemble(n, s.config.index_coding(), sel,
                    all_nonzero ? update.data() : nullptr, update, residual);
}

Result<EncodedUpdate> UpdateEncoder::EncodeSparse(
    uint64_t size, std::span<const uint32_t> indices,
    std::span<const float> values, std::span<float> residual) {
  State& s = *state_;
  const size_t m = values.size();
  if (size > kMaxCompressedSliceElements) {
    return InvalidArgumentError("slice of " + std::to_string(size) +
                                " elements: at most " +
                                std::to_string(kMaxCompressedSliceElements));
  }
  if (indices.size() != m) {
    return InvalidArgumentError(std::to_string(indices.size()) +
                                " indices but " + std::to_string(m) +
                                " values");
  }
  if (!residual.empty()) {
    if (residual.size() != m) {
      return InvalidArgumentError("residual has " +
                                  std::to_string(residual.size()) +
                                  " elements, the update " + std::to_string(m));
    }
    if (residual.data() != values.data() &&
        Overlap(residual.data(), m * sizeof(float), values.data(),
                m * sizeof(float))) {
      return InvalidArgumentError(
          "residual overlaps the values without being the same span");
    }
  }
  uint64_t next = 0;  // the smallest index allowed next
  for (size_t j = 0; j < m; ++j) {
    if (indices[j] < next || indices[j] >= size) {
      return InvalidArgumentError(
          "indices[" + std::to_string(j) + "] = " + std::to_string(indices[j]) +
          (indices[j] >= size
               ? " is outside the slice of " + std::to_string(size)
               : std::string(" is not above the previous index")));
    }
    next = uint64_t{indices[j]} + 1;
  }
  if (!compression::ScanValues(values.data(), m).finite) {
    const size_t at = FirstNonFinite(values);
    return InvalidArgumentError("values[" + std::to_string(at) + "] is " +
                                std::to_string(values[at]) +
                                ": only finite values can be encoded");
  }
  ++s.calls;

  const uint64_t k =
      s.config.selection() == pb::SELECT_ALL
          ? m
          : std::min<uint64_t>(m, TopK(s.config.top_k_fraction(), size));
  State::Selected sel;
  if (k == m) {
    sel.m = m;
    sel.indices = indices.data();
    sel.values = values.data();
    sel.slots = nullptr;
  } else {
    sel.m = s.SelectTopK(values.data(), m, 0, m, k);
    uint32_t* idx = Grow(s.indices, sel.m);
    for (size_t j = 0; j < sel.m; ++j) idx[j] = indices[s.positions[j]];
    sel.indices = idx;
    sel.values = s.values.data();
    sel.slots = s.positions.data();
  }
  return s.Assemble(size, s.config.index_coding(), sel, nullptr, values,
                    residual);
}

// ---- header -----------------------------------------------------------------

namespace {

// The fixed header of `encoded`: magic, version, checksum (when
// options.verify_checksum) and the codings byte.
Result<EncodedInfo> ParseFixedHeader(std::span<const std::byte> encoded,
                                     const DecodeOptions& options) {
  if (encoded.size() < kFixedHeaderBytes) {
    return DataLossError(
        "encoded update truncated: " + std::to_string(encoded.size()) +
        " bytes, shorter than the fixed header (" +
        std::to_string(kFixedHeaderBytes) + ")");
  }
  if (encoded[0] != compression::kMagic0 ||
      encoded[1] != compression::kMagic1) {
    return DataLossError("not an encoded update (bad magic)");
  }
  EncodedInfo info;
  info.version = std::to_integer<uint8_t>(encoded[compression::kVersionOffset]);
  if (info.version != kCompressionFormatVersion) {
    return InvalidArgumentError("encoded update has format version " +
                                std::to_string(info.version) +
                                "; this decoder reads version " +
                                std::to_string(kCompressionFormatVersion));
  }
  if (options.verify_checksum) {
    uint32_t stored;
    std::memcpy(&stored, encoded.data() + compression::kChecksumOffset,
                sizeof(stored));
    if (stored != compression::ComputeChecksum(encoded)) {
      return DataLossError("encoded update is corrupt (checksum mismatch)");
    }
  }
  const uint8_t codings =
      std::to_integer<uint8_t>(encoded[compression::kCodingsOffset]);
  const int value = codings & compression::kValueCodingMask;
  const int index = (codings >> compression::kIndexCodingShift) &
                    compression::kIndexCodingMask;
  if ((codings & compression::kReservedBit) != 0 || value < pb::VALUE_FP32 ||
      value > pb::VALUE_INT2 || index < pb::INDEX_DELTA_VARINT ||
      index > pb::INDEX_DENSE) {
    return DataLossError("encoded update has an invalid codings byte " +
                         std::to_string(codings));
  }
  info.value_coding = static_cast<pb::ValueCoding>(value);
  info.index_coding = static_cast<pb::IndexCoding>(index);
  info.zstd = (codings & compression::kZstdBit) != 0;
  return info;
}

// The varint fields after the fixed header (size, count, block size, index
// section size): sets their fields of *info, its body_bytes and
// header_bytes. Refuses slices of more than max_elements elements as soon
// as the size field is read (OutOfRange).
Status ParseHeaderFields(std::span<const std::byte> encoded,
                         uint64_t max_elements, EncodedInfo* info_out) {
  EncodedInfo& info = *info_out;
  const std::byte* p = encoded.data() + kFixedHeaderBytes;
  const std::byte* const end = encoded.data() + encoded.size();
  uint64_t field;
  if (!compression::ReadVarint(&p, end, compression::kMaxVarint32Bytes,
                               &field)) {
    return DataLossError("encoded update: bad or truncated size field");
  }
  info.size = field;
  if (info.size > max_elements) {
    return OutOfRangeError("encoded update is for a slice of " +
                           std::to_string(info.size) +
                           " elements, more than the " +
                           std::to_string(max_elements) + " allowed");
  }
  if (!compression::ReadVarint(&p, end, compression::kMaxVarint32Bytes,
                               &field)) {
    return DataLossError("encoded update: bad or truncated count field");
  }
  info.count = field;
  if (info.count > info.size) {
    return DataLossError("encoded update carries " +
                         std::to_string(info.count) +
                         " entries of a slice of " + std::to_string(info.size));
  }
  if (info.index_coding == pb::INDEX_DENSE && info.count != info.size) {
    return DataLossError("dense encoded update carries " +
                         std::to_string(info.count) + " of " +
                         std::to_string(info.size) + " entries");
  }
  if (compression::HasScales(info.value_coding)) {
    if (!compression::ReadVarint(&p, end, compression::kMaxVarint32Bytes,
                                 &field) ||
        field < 1 || field > kMaxCompressionBlockSize) {
      return DataLossError("encoded update: bad block size field");
    }
    info.block_size = static_cast<uint32_t>(field);
  }
  switch (info.index_coding) {
    case pb::INDEX_DELTA_VARINT:
      if (!compression::ReadVarint(&p, end, compression::kMaxVarint64Bytes,
                                   &field) ||
          field < info.count ||
          field > compression::kMaxVarint32Bytes * info.count) {
        return DataLossError("encoded update: bad index section size");
      }
      info.index_bytes = field;
      break;
    case pb::INDEX_BITMAP:
      info.index_bytes = compression::BitmapBytes(info.size);
      break;
    default:
      info.index_bytes = 0;
  }
  info.body_bytes =
      info.index_bytes +
      compression::ValueSectionBytes(info.value_coding, info.count,
                                     std::max<uint32_t>(info.block_size, 1));
  info.header_bytes = static_cast<size_t>(p - encoded.data());
  return Status::Ok();
}

// The payload after the header: exactly the body, or one zstd frame that
// declares the body's size.
Status CheckPayload(std::span<const std::byte> payload,
                    const EncodedInfo& info) {
  if (!info.zstd) {
    if (payload.size() != info.body_bytes) {
      return DataLossError(
          "encoded update body has " + std::to_string(payload.size()) +
          " bytes, its header says " + std::to_string(info.body_bytes));
    }
    return Status::Ok();
  }
  // One zstd frame, exactly, declaring the body's size.
  if (info.body_bytes == 0) {
    return DataLossError("encoded update: zstd stage on an empty body");
  }
  const unsigned long long content =
      ZSTD_getFrameContentSize(payload.data(), payload.size());
  if (content != info.body_bytes) {
    return DataLossError(
        "encoded update: the zstd frame does not declare the body size " +
        std::to_string(info.body_bytes));
  }
  const size_t frame =
      ZSTD_findFrameCompressedSize(payload.data(), payload.size());
  if (ZSTD_isError(frame) || frame != payload.size()) {
    return DataLossError(
        "encoded update: the zstd frame is truncated or "
        "followed by other bytes");
  }
  return Status::Ok();
}

// InspectEncoded, refusing slices of more than max_elements elements as
// soon as the size field is read (OutOfRange).
Result<EncodedInfo> ParseEncoded(std::span<const std::byte> encoded,
                                 const DecodeOptions& options,
                                 uint64_t max_elements) {
  MERIDIAN_ASSIGN_OR_RETURN(EncodedInfo info,
                            ParseFixedHeader(encoded, options));
  MERIDIAN_RETURN_IF_ERROR(ParseHeaderFields(encoded, max_elements, &info));
  MERIDIAN_RETURN_IF_ERROR(
      CheckPayload(encoded.subspan(info.header_bytes), info));
  return info;
}

}  // namespace

Result<EncodedInfo> InspectEncoded(std::span<const std::byte> encoded,
                                   const DecodeOptions& options) {
  return ParseEncoded(encoded, options, kMaxCompressedSliceElements);
}

// ---- decoder ----------------------------------------------------------------

struct UpdateDecoder::State {
  DecodeOptions options;
  std::unique_ptr<ZSTD_DCtx, ZstdDCtxDeleter> dctx;  // created on first use
  std::vector<std::byte> body;
  std::vector<uint32_t> indices;
  std::vector<float> values;

  // The header of `encoded` (its slice at most max_elements) and the
  // uncompressed body.
  Status Open(std::span<const std::byte> encoded, uint64_t max_elements,
              EncodedInfo* info, std::span<const std::byte>* body_out) {
    MERIDIAN_ASSIGN_OR_RETURN(*info,
                              ParseEncoded(encoded, options, max_elements));
    const std::span<const std::byte> payload =
        encoded.subspan(info->header_bytes);
    if (!info->zstd) {
      *body_out = payload;
      return Status::Ok();
    }
    if (dctx == nullptr) {
      dctx.reset(ZSTD_createDCtx());
      if (dctx == nullptr) {
        return InternalError("zstd: cannot create a decompression context");
      }
    }
    std::byte* dst = nullptr;
    MERIDIAN_RETURN_IF_ERROR(GrowForDecode(body, info->body_bytes, &dst));
    const size_t r = ZSTD_decompressDCtx(dctx.get(), dst, info->body_bytes,
                                         payload.data(), payload.size());
    if (ZSTD_isError(r)) {
      return DataLossError(std::string("encoded update: zstd: ") +
                           ZSTD_getErrorName(r));
    }
    if (r != info->body_bytes) {
      return DataLossError("encoded update: zstd produced " +
                           std::to_string(r) + " bytes, the header says " +
                           std::to_string(info->body_bytes));
    }
    *body_out = std::span<const std::byte>(dst, info->body_bytes);
    return Status::Ok();
  }

  // Decodes the index section into indices[0, count) (not for DENSE).
  static Status ReadIndices(const EncodedInfo& info,
                            std::span<const std::byte> body,
                            uint32_t* indices) {
    const std::span<const std::byte> section =
        body.first(static_cast<size_t>(info.index_bytes));
    if (info.index_coding == pb::INDEX_BITMAP) {
      return compression::ReadBitmap(section, info.size, info.count, indices);
    }
    return compression::ReadDeltaVarint(section, info.size, info.count,
                                        indices);
  }

  static Status ReadValues(const EncodedInfo& info,
                           std::span<const std::byte> body, float* values) {
    return compression::DecodeValues(
        info.value_coding, info.block_size,
        body.subspan(static_cast<size_t>(info.index_bytes)), info.count,
        values);
  }

  // Decodes the carried entries into the scratch vectors (indices only
  // when not dense) for a slice of exactly `size` elements.
  Status DecodeToScratch(std::span<const std::byte> encoded, uint64_t size,
                         EncodedInfo* info) {
    std::span<const std::byte> body_view;
    MERIDIAN_RETURN_IF_ERROR(Open(encoded, size, info, &body_view));
    if (info->size != size) {
      return InvalidArgumentError(
          "encoded update is for a slice of " + std::to_string(info->size) +
          " elements, the destination has " + std::to_string(size));
    }
    uint32_t* idx = nullptr;
    float* val = nullptr;
    MERIDIAN_RETURN_IF_ERROR(GrowForDecode(indices, info->count, &idx));
    MERIDIAN_RETURN_IF_ERROR(GrowForDecode(values, info->count, &val));
    if (info->index_coding != pb::INDEX_DENSE) {
      MERIDIAN_RETURN_IF_ERROR(ReadIndices(*info, body_view, idx));
    }
    return ReadValues(*info, body_view, val);
  }
};

UpdateDecoder::UpdateDecoder(DecodeOptions options)
    : state_(std::make_unique<State>()) {
  state_->options = options;
}
UpdateDecoder::UpdateDecoder(UpdateDecoder&&) noexcept = default;
UpdateDecoder& UpdateDecoder::operator=(UpdateDecoder&&) noexcept = default;
UpdateDecoder::~UpdateDecoder() = default;

Status UpdateDecoder::DecodeDense(std::span<const std::byte> encoded,
                                  std::span<float> out) {
  State& s = *state_;
  EncodedInfo info;
  std::span<const std::byte> body;
  MERIDIAN_RETURN_IF_ERROR(s.Open(encoded, out.size(), &info, &body));
  if (info.size != out.size()) {
    return InvalidArgumentError(
        "encoded update is for a slice of " + std::to_string(info.size) +
        " elements, the destination has " + std::to_string(out.size()));
  }
  if (info.index_coding == pb::INDEX_DENSE) {
    return State::ReadValues(info, body, out.data());
  }
  uint32_t* idx = nullptr;
  float* val = nullptr;
  MERIDIAN_RETURN_IF_ERROR(GrowForDecode(s.indices, info.count, &idx));
  MERIDIAN_RETURN_IF_ERROR(GrowForDecode(s.values, info.count, &val));
  MERIDIAN_RETURN_IF_ERROR(State::ReadIndices(info, body, idx));
  MERIDIAN_RETURN_IF_ERROR(State::ReadValues(info, body, val));
  std::fill(out.begin(), out.end(), 0.0f);
  for (size_t j = 0; j < info.count; ++j) out[idx[j]] = val[j];
  return Status::Ok();
}

Status UpdateDecoder::DecodeAdd(std::span<const std::byte> encoded,
                                std::span<float> target) {
  State& s = *state_;
  EncodedInfo info;
  MERIDIAN_RETURN_IF_ERROR(s.DecodeToScratch(encoded, target.size(), &info));
  const float* val = s.values.data();
  if (info.index_coding == pb::INDEX_DENSE) {
    for (size_t i = 0; i < info.count; ++i) target[i] += val[i];
  } else {
    const uint32_t* idx = s.indices.data();
    for (size_t j = 0; j < info.count; ++j) target[idx[j]] += val[j];
  }
  return Status::Ok();
}

Status UpdateDecoder::DecodeSparse(std::span<const std::byte> encoded,
                                   uint64_t max_elements, SparseUpdate* out) {
  State& s = *state_;
  EncodedInfo info;
  std::span<const std::byte> body;
  MERIDIAN_RETURN_IF_ERROR(s.Open(encoded, max_elements, &info, &body));
  out->size = info.size;
  try {
    out->indices.resize(info.count);
    out->values.resize(info.count);
  } catch (const std::exception& e) {  // bad_alloc, length_error
    return OutOfRangeError("cannot allocate " + std::to_string(info.count) +
                           " decoded entries: " + e.what());
  }
  if (info.index_coding == pb::INDEX_DENSE) {
    std::iota(out->indices.begin(), out->indices.end(), uint32_t{0});
  } else {
    MERIDIAN_RETURN_IF_ERROR(
        State::ReadIndices(info, body, out->indices.data()));
  }
  return State::ReadValues(info, body, out->values.data());
}

}  // namespace meridian
