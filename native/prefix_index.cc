// N-API surface of the prefix index: the PrefixIndex class wraps one
// prefix::Index. Every method takes typed arrays and works on the whole batch
// in one call; arguments are checked here and bad ones throw TypeError or
// RangeError (never abort). bindings/prefix-index.ts is the only caller.
#include "prefix_index.h"

#include <memory>

#include "prefix_core.h"
#include "prefix_hash.h"
#include "kv_events.h"
#include "kv_decode.h"

namespace switchyard {
namespace {

using prefix::Index;
using prefix::kTiers;

constexpr uint32_t kMaxBlockSize = 1u << 20;

void ThrowType(Napi::Env env, const char* msg) { Napi::TypeError::New(env, msg).ThrowAsJavaScriptException(); }
void ThrowRange(Napi::Env env, const char* msg) { Napi::RangeError::New(env, msg).ThrowAsJavaScriptException(); }

// Reads an integer in [0, max]; throws and returns false otherwise.
bool GetUint(const Napi::CallbackInfo& info, size_t i, const char* type_msg, const char* range_msg, double max,
             uint32_t* out) {
  napi_value v = info[i];
  napi_valuetype t;
  napi_typeof(info.Env(), v, &t);
  if (t != napi_number) {
    ThrowType(info.Env(), type_msg);
    return false;
  }
  double d;
  napi_get_value_double(info.Env(), v, &d);
  if (!(d >= 0 && d <= max) || d != static_cast<double>(static_cast<uint64_t>(d))) {
    ThrowRange(info.Env(), range_msg);
    return false;
  }
  *out = static_cast<uint32_t>(d);
  return true;
}

// Reads a typed array of the given element type; throws and returns false otherwise.
template <typename T>
bool GetArray(const Napi::CallbackInfo& info, size_t i, napi_typedarray_type want, const char* msg, T** data,
              size_t* len) {
  napi_env env = info.Env();
  napi_value v = info[i];
  napi_typedarray_type type;
  void* ptr = nullptr;
  // Fails (napi_invalid_arg, no exception) for anything but a typed array.
  if (napi_get_typedarray_info(env, v, &type, len, &ptr, nullptr, nullptr) != napi_ok || type != want) {
    ThrowType(info.Env(), msg);
    return false;
  }
  *data = static_cast<T*>(ptr);
  if (*data == nullptr) *len = 0;  // detached or empty buffer
  return true;
}

bool GetSeed(const Napi::CallbackInfo& info, size_t i, uint64_t* out) {
  bool lossless = false;
  // Fails (napi_bigint_expected, no exception) for anything but a bigint.
  if (napi_get_value_bigint_uint64(info.Env(), info[i], out, &lossless) != napi_ok) {
    ThrowType(info.Env(), "seed must be a bigint");
    return false;
  }
  if (!lossless) {
    ThrowRange(info.Env(), "seed must be a bigint in [0, 2^64)");
    return false;
  }
  return true;
}

class PrefixIndexWrap : public Napi::ObjectWrap<PrefixIndexWrap> {
 public:
  static Napi::Function Define(Napi::Env env) {
    return DefineClass(env, "PrefixIndex",
                       {
                           InstanceMethod<&PrefixIndexWrap::SetCapacity>("setCapacity"),
                           InstanceMethod<&PrefixIndexWrap::HashPromptInto>("hashPrompt"),
                           InstanceMethod<&PrefixIndexWrap::MatchPrompt>("matchPrompt"),
                           InstanceMethod<&PrefixIndexWrap::MatchHashes>("matchHashes"),
                           InstanceMethod<&PrefixIndexWrap::Record>("record"),
                           InstanceMethod<&PrefixIndexWrap::Remove>("remove"),
                           InstanceMethod<&PrefixIndexWrap::Clear>("clear"),
                           InstanceMethod<&PrefixIndexWrap::RemoveEndpoint>("removeEndpoint"),
                           InstanceMethod<&PrefixIndexWrap::Stats>("stats"),
                           InstanceMethod<&PrefixIndexWrap::ApplyEvents>("applyEvents"),
                           InstanceMethod<&PrefixIndexWrap::MappedBlocks>("mappedBlocks"),
                           InstanceMethod<&PrefixIndexWrap::ApplyPayloads>("applyPayloads"),
                           InstanceMethod<&PrefixIndexWrap::SetEventMapLimit>("setEventMapLimit"),
                           InstanceMethod<&PrefixIndexWrap::ApplyOps>("applyOps"),
                       });
  }

  // new PrefixIndex(blockSize, maxEndpoints, defaultGpu, defaultCpu, defaultDisk)
  explicit PrefixIndexWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<PrefixIndexWrap>(info) {
    uint32_t block_size, max_eps, cap[kTiers];
    if (!GetUint(info, 0, "blockSize must be a number", "blockSize must be an integer in [1, 1048576]",
                 kMaxBlockSize, &block_size))
      return;
    if (block_size == 0) {
      ThrowRange(info.Env(), "blockSize must be an integer in [1, 1048576]");
      return;
    }
    if (!GetUint(info, 1, "maxEndpoints must be a number", "maxEndpoints must be an integer in [1, 16384]",
                 prefix::kMaxEndpointsLimit, &max_eps))
      return;
    if (max_eps == 0) {
      ThrowRange(info.Env(), "maxEndpoints must be an integer in [1, 16384]");
      return;
    }
    if (!GetCapacity(info, 2, cap)) return;
    block_size_ = block_size;
    index_ = std::make_unique<Index>(max_eps, cap);
    events_ = std::make_unique<prefix::EventMap>(max_eps);
  }

 private:
  bool Ready(const Napi::CallbackInfo& info) {
    if (index_) return true;
    ThrowType(info.Env(), "PrefixIndex was not constructed");
    return false;
  }

  bool GetEndpoint(const Napi::CallbackInfo& info, size_t i, uint32_t* ep) {
    return GetUint(info, i, "endpoint must be a number", "endpoint must be an integer in [0, maxEndpoints)",
                   index_->max_endpoints() - 1, ep);
  }

  static bool GetCapacity(const Napi::CallbackInfo& info, size_t first, uint32_t cap[kTiers]) {
    for (int t = 0; t < kTiers; t++) {
      if (!GetUint(info, first + t, "capacity must be three numbers", "capacity must be integers in [0, 2^32)",
                   4294967295.0, &cap[t]))
        return false;
    }
    return true;
  }

  // Reads (hashes: BigUint64Array, count: number) at i, i+1.
  static bool GetHashes(const Napi::CallbackInfo& info, size_t i, const uint64_t** keys, size_t* count) {
    uint64_t* data;
    size_t len;
    if (!GetArray(info, i, napi_biguint64_array, "hashes must be a BigUint64Array", &data, &len)) return false;
    uint32_t n;
    if (!GetUint(info, i + 1, "count must be a number", "count must be an integer in [0, hashes.length]", len, &n))
      return false;
    *keys = data;
    *count = n;
    return true;
  }

  // Reads (candidates: Int32Array, matched: Uint32Array, tiers: Uint32Array) at i.
  static bool GetMatchOut(const Napi::CallbackInfo& info, size_t i, const int32_t** cands, size_t* nc,
                          uint32_t** matched, uint32_t** tiers) {
    int32_t* c;
    size_t n, nm, nt;
    if (!GetArray(info, i, napi_int32_array, "candidates must be an Int32Array", &c, &n)) return false;
    if (!GetArray(info, i + 1, napi_uint32_array, "matched must be a Uint32Array", matched, &nm)) return false;
    if (!GetArray(info, i + 2, napi_uint32_array, "tiers must be a Uint32Array", tiers, &nt)) return false;
    if (nm < n || nt < n * kTiers) {
      ThrowRange(info.Env(), "result arrays are too small for the candidates");
      return false;
    }
    *cands = c;
    *nc = n;
    return true;
  }

  void SetCapacity(const Napi::CallbackInfo& info) {
    uint32_t ep, cap[kTiers];
    if (!Ready(info) || !GetEndpoint(info, 0, &ep) || !GetCapacity(info, 1, cap)) return;
    index_->SetCapacity(ep, cap);
    ReportMemory(info.Env());
  }

  // hashPrompt(prompt: Uint8Array, seed: bigint, out: BigUint64Array) -> count
  Napi::Value HashPromptInto(const Napi::CallbackInfo& info) {
    const uint8_t* p;
    size_t len, out_len;
    uint64_t seed, *out;
    if (!Ready(info) || !GetArray(info, 0, napi_uint8_array, "prompt must be a Uint8Array", &p, &len) ||
        !GetSeed(info, 1, &seed) || !GetArray(info, 2, napi_biguint64_array, "out must be a BigUint64Array", &out, &out_len))
      return info.Env().Undefined();
    const size_t count = len / block_size_;
    if (out_len < count) {
      ThrowRange(info.Env(), "out is too small for the prompt's blocks");
      return info.Env().Undefined();
    }
    prefix::HashPrompt(p, len, block_size_, seed, out);
    return Napi::Number::New(info.Env(), static_cast<double>(count));
  }

  // matchPrompt(prompt, seed, hashesOut, candidates, matched, tiers) -> hash count
  Napi::Value MatchPrompt(const Napi::CallbackInfo& info) {
    const uint8_t* p;
    size_t len, out_len, nc;
    uint64_t seed, *out;
    const int32_t* cands;
    uint32_t *matched, *tiers;
    if (!Ready(info) || !GetArray(info, 0, napi_uint8_array, "prompt must be a Uint8Array", &p, &len) ||
        !GetSeed(info, 1, &seed) ||
        !GetArray(info, 2, napi_biguint64_array, "hashes must be a BigUint64Array", &out, &out_len) ||
        !GetMatchOut(info, 3, &cands, &nc, &matched, &tiers))
      return info.Env().Undefined();
    const size_t count = len / block_size_;
    if (out_len < count) {
      ThrowRange(info.Env(), "hashes is too small for the prompt's blocks");
      return info.Env().Undefined();
    }
    index_->MatchPrompt(p, len, block_size_, seed, out, cands, nc, matched, tiers);
    return Napi::Number::New(info.Env(), static_cast<double>(count));
  }

  // matchHashes(hashes, count, candidates, matched, tiers)
  void MatchHashes(const Napi::CallbackInfo& info) {
    const uint64_t* keys;
    size_t count, nc;
    const int32_t* cands;
    uint32_t *matched, *tiers;
    if (!Ready(info) || !GetHashes(info, 0, &keys, &count) || !GetMatchOut(info, 2, &cands, &nc, &matched, &tiers))
      return;
    index_->Match(keys, count, cands, nc, matched, tiers);
  }

  // record(endpoint, hashes, count, tier)
  void Record(const Napi::CallbackInfo& info) {
    uint32_t ep, tier;
    const uint64_t* keys;
    size_t count;
    if (!Ready(info) || !GetEndpoint(info, 0, &ep) || !GetHashes(info, 1, &keys, &count) ||
        !GetUint(info, 3, "tier must be a number", "tier must be 0, 1 or 2", kTiers - 1, &tier))
      return;
    index_->Record(ep, keys, count, static_cast<int>(tier));
    ReportMemory(info.Env());
  }

  // remove(endpoint, hashes, count)
  void Remove(const Napi::CallbackInfo& info) {
    uint32_t ep;
    const uint64_t* keys;
    size_t count;
    if (!Ready(info) || !GetEndpoint(info, 0, &ep) || !GetHashes(info, 1, &keys, &count)) return;
    index_->Remove(ep, keys, count);
    ReportMemory(info.Env());
  }

  void Clear(const Napi::CallbackInfo& info) {
    uint32_t ep;
    if (!Ready(info) || !GetEndpoint(info, 0, &ep)) return;
    index_->Clear(ep);
    events_->Clear(ep);
    ReportMemory(info.Env());
  }

  void RemoveEndpoint(const Napi::CallbackInfo& info) {
    uint32_t ep;
    if (!Ready(info) || !GetEndpoint(info, 0, &ep)) return;
    index_->RemoveEndpoint(ep);
    events_->Clear(ep);
    ReportMemory(info.Env());
  }

  // applyOps(ops: Int32Array, nOps, hashes: BigUint64Array, nHashes) -> applied: another router's prefix
  // records (what it sent where: src/ha/deltas.ts) in one call. ops holds nOps triples [kind, endpoint, count]
  // (kind 1 record, 2 remove, 3 clear; endpoint -1: an endpoint this router does not have, its hashes are
  // skipped); each op's `count` hashes follow the previous op's in `hashes`. Everything is checked before
  // anything is applied (RangeError: nothing applied). Returns the ops applied (those with an endpoint).
  Napi::Value ApplyOps(const Napi::CallbackInfo& info) {
    int32_t* ops;
    uint64_t* hashes;
    size_t ops_len, hashes_len;
    uint32_t n_ops, n_hashes;
    if (!Ready(info) || !GetArray(info, 0, napi_int32_array, "ops must be an Int32Array", &ops, &ops_len) ||
        !GetUint(info, 1, "nOps must be a number", "nOps must be an integer in [0, ops.length / 3]",
                 static_cast<double>(ops_len / 3), &n_ops) ||
        !GetArray(info, 2, napi_biguint64_array, "hashes must be a BigUint64Array", &hashes, &hashes_len) ||
        !GetUint(info, 3, "nHashes must be a number", "nHashes must be an integer in [0, hashes.length]",
                 static_cast<double>(hashes_len), &n_hashes))
      return info.Env().Undefined();
    const int64_t max_ep = index_->max_endpoints();
    size_t at = 0;
    for (uint32_t k = 0; k < n_ops; k++) {
      const int32_t kind = ops[3 * k], ep = ops[3 * k + 1], count = ops[3 * k + 2];
      if (kind < 1 || kind > 3) return ThrowRange(info.Env(), "op kind must be 1 (record), 2 (remove) or 3 (clear)"), info.Env().Undefined();
      if (ep < -1 || ep >= max_ep) return ThrowRange(info.Env(), "op endpoint must be -1 or in [0, maxEndpoints)"), info.Env().Undefined();
      if (count < 0 || at + static_cast<size_t>(count) > n_hashes) return ThrowRange(info.Env(), "op hash counts exceed nHashes"), info.Env().Undefined();
      at += static_cast<size_t>(count);
    }
    uint32_t applied = 0;
    at = 0;
    for (uint32_t k = 0; k < n_ops; k++) {
      const int32_t kind = ops[3 * k], ep = ops[3 * k + 1];
      const size_t count = static_cast<size_t>(ops[3 * k + 2]);
      const uint64_t* keys = hashes + at;
      at += count;
      if (ep < 0) continue;
      const uint32_t e = static_cast<uint32_t>(ep);
      if (kind == 1) {
        if (count > 0) index_->Record(e, keys, count, 0);
      } else if (kind == 2) {
        if (count > 0) index_->Remove(e, keys, count);
      } else {
        index_->Clear(e);
        events_->Clear(e);
      }
      applied++;
    }
    ReportMemory(info.Env());
    return Napi::Number::New(info.Env(), applied);
  }

  // applyEvents(ops: Uint32Array, nOps, words: Uint32Array, tokens: Uint32Array, totals: Float64Array(4)):
  // a whole batch of KV events in one call (native/kv_events.h); totals are added to.
  void ApplyEvents(const Napi::CallbackInfo& info) {
    uint32_t *ops, *words, *tokens, n_ops;
    size_t ops_len, words_len, tokens_len, out_len;
    double* out;
    if (!Ready(info) || !GetArray(info, 0, napi_uint32_array, "ops must be a Uint32Array", &ops, &ops_len) ||
        !GetUint(info, 1, "nOps must be a number", "nOps must be an integer in [0, ops.length / 8]",
                 static_cast<double>(ops_len / prefix::kOpWords), &n_ops) ||
        !GetArray(info, 2, napi_uint32_array, "words must be a Uint32Array", &words, &words_len) ||
        !GetArray(info, 3, napi_uint32_array, "tokens must be a Uint32Array", &tokens, &tokens_len) ||
        !GetArray(info, 4, napi_float64_array, "totals must be a Float64Array", &out, &out_len))
      return;
    if (out_len < 4) return ThrowRange(info.Env(), "totals must hold 4 numbers");
    if (block_size_ % 4 != 0) return ThrowRange(info.Env(), "applyEvents needs a blockSize that is a multiple of 4 bytes");
    prefix::EventTotals t;
    const char* err = events_->Apply(*index_, block_size_, ops, n_ops, words, words_len, tokens, tokens_len, t);
    out[0] += t.stored;
    out[1] += t.removed;
    out[2] += t.orphans;
    out[3] += t.unknown;
    if (out_len >= 5) out[4] += t.forgotten;
    ReportMemory(info.Env());
    if (err != nullptr) ThrowRange(info.Env(), err);
  }

  // applyPayloads(data: Uint8Array, items: Uint32Array, nItems, ranks: Int32Array, status: Uint8Array,
  //               totals: Float64Array(13)): a whole drain of raw msgpack event batches (and clears), decoded
  // and applied in one call (native/kv_decode.h). Items are 8 uint32 each (kv_decode.h); status[i] gets item
  // i's outcome (0 applied, 1 malformed: its holders were cleared, 2 dropped rank, 3 clear). totals are added
  // to: [stored, removed, orphans, unknownRemovals, forgotten, events, unknownEvents, badEvents, badHashes,
  // blockSizeMismatch, droppedRanks, malformed, batches]. Every item is checked before anything is applied.
  void ApplyPayloads(const Napi::CallbackInfo& info) {
    uint8_t *data, *status;
    uint32_t *items, n_items;
    int32_t* ranks;
    double* out;
    size_t data_len, items_len, ranks_len, status_len, out_len;
    if (!Ready(info) || !GetArray(info, 0, napi_uint8_array, "data must be a Uint8Array", &data, &data_len) ||
        !GetArray(info, 1, napi_uint32_array, "items must be a Uint32Array", &items, &items_len) ||
        !GetUint(info, 2, "nItems must be a number", "nItems must be an integer in [0, items.length / 8]",
                 static_cast<double>(items_len / prefix::kItemWords), &n_items) ||
        !GetArray(info, 3, napi_int32_array, "ranks must be an Int32Array", &ranks, &ranks_len) ||
        !GetArray(info, 4, napi_uint8_array, "status must be a Uint8Array", &status, &status_len) ||
        !GetArray(info, 5, napi_float64_array, "totals must be a Float64Array", &out, &out_len))
      return;
    if (out_len < 13) return ThrowRange(info.Env(), "totals must hold 13 numbers");
    if (status_len < n_items) return ThrowRange(info.Env(), "status must hold nItems bytes");
    if (block_size_ % 4 != 0) return ThrowRange(info.Env(), "applyPayloads needs a blockSize that is a multiple of 4 bytes");
    const uint32_t max_ep = index_->max_endpoints();
    for (size_t i = 0; i < n_items; i++) {
      const uint32_t* it = items + i * prefix::kItemWords;
      if (it[0] != prefix::kItemPayload && it[0] != prefix::kItemClear) return ThrowRange(info.Env(), "item kind must be 1 (payload) or 2 (clear)");
      if (it[0] == prefix::kItemPayload && (it[1] > it[2] || it[2] > data_len)) return ThrowRange(info.Env(), "item payload range out of data");
      if (it[3] >= max_ep) return ThrowRange(info.Env(), "item holder must be an endpoint in [0, maxEndpoints)");
      if (static_cast<size_t>(it[4]) + it[5] > ranks_len) return ThrowRange(info.Env(), "item rank table out of ranks");
      for (uint32_t r = 0; r < it[5]; r++) {
        const int32_t h = ranks[it[4] + r];
        if (h < -1 || (h >= 0 && static_cast<uint32_t>(h) >= max_ep)) return ThrowRange(info.Env(), "ranks entries must be -1 or an endpoint in [0, maxEndpoints)");
      }
    }
    prefix::DecodeTotals d;
    decoder_.Decode(data, items, n_items, ranks, static_cast<uint32_t>(block_size_ / 4), status, d);
    prefix::EventTotals t;
    const auto& ops = decoder_.ops;
    const char* err = events_->Apply(*index_, block_size_, ops.data(), ops.size() / prefix::kOpWords,
                                     decoder_.words.data(), decoder_.words.size(), decoder_.tokens.data(),
                                     decoder_.tokens.size(), t);
    const double v[13] = {t.stored, t.removed, t.orphans, t.unknown, t.forgotten, d.events, d.unknown_events,
                          d.bad_events, d.bad_hashes, d.block_size_mismatch, d.dropped_ranks, d.malformed, d.batches};
    for (int k = 0; k < 13; k++) out[k] += v[k];
    decoder_.Trim();
    events_->Trim();
    ReportMemory(info.Env());
    if (err != nullptr) ThrowRange(info.Env(), err);  // not reached: the decoder only makes valid records
  }

  // setEventMapLimit(limit): engine hashes remembered per endpoint (kv_events.h)
  void SetEventMapLimit(const Napi::CallbackInfo& info) {
    uint32_t limit;
    if (!Ready(info) || !GetUint(info, 0, "limit must be a number", "limit must be an integer in [1, 2^32)",
                                 4294967295.0, &limit))
      return;
    if (limit == 0) return ThrowRange(info.Env(), "limit must be an integer in [1, 2^32)");
    events_->SetLimit(limit);
  }

  // mappedBlocks(ep) -> engine block hashes remembered for ep
  Napi::Value MappedBlocks(const Napi::CallbackInfo& info) {
    uint32_t ep;
    if (!Ready(info) || !GetEndpoint(info, 0, &ep)) return info.Env().Undefined();
    return Napi::Number::New(info.Env(), static_cast<double>(events_->Mapped_(ep)));
  }

  // stats(out: Float64Array(6)): [gpu, cpu, disk, blocks, bytes, endpoints]
  void Stats(const Napi::CallbackInfo& info) {
    double* out;
    size_t len;
    if (!Ready(info) || !GetArray(info, 0, napi_float64_array, "out must be a Float64Array", &out, &len)) return;
    if (len < 6) return ThrowRange(info.Env(), "out must hold 6 numbers");
    const Index::Stats st = index_->GetStats();
    for (int t = 0; t < kTiers; t++) out[t] = static_cast<double>(st.entries[t]);
    out[3] = static_cast<double>(st.blocks);
    out[4] = static_cast<double>(st.bytes);
    out[5] = static_cast<double>(st.endpoints);
  }

  // Tells V8 how much native memory this object holds (in 1 MiB steps), so
  // the garbage collector weighs a dropped index by its real size.
  void ReportMemory(Napi::Env env) {
    const int64_t now = static_cast<int64_t>(index_->Bytes());
    if (now - reported_ > (1 << 20) || reported_ - now > (1 << 20)) {
      Napi::MemoryManagement::AdjustExternalMemory(env, now - reported_);
      reported_ = now;
    }
  }

 public:
  ~PrefixIndexWrap() override {
    if (reported_ != 0) {
      int64_t ignored;
      napi_adjust_external_memory(Env(), -reported_, &ignored);
    }
  }

 private:
  size_t block_size_ = 64;
  int64_t reported_ = 0;
  std::unique_ptr<Index> index_;  // freed by the finalizer, also at environment teardown
  std::unique_ptr<prefix::EventMap> events_;  // precise mode: engine hash -> key, per endpoint
  prefix::BatchDecoder decoder_;              // precise mode: raw batches -> event op records (reused buffers)
};

// prefixSeed(bytes: Uint8Array, salt: bigint) -> bigint: a seed for the chain
// from a model name (and cache salt), so different models never share blocks.
Napi::Value PrefixSeed(const Napi::CallbackInfo& info) {
  const uint8_t* p;
  size_t len;
  uint64_t salt;
  if (!GetArray(info, 0, napi_uint8_array, "bytes must be a Uint8Array", &p, &len) || !GetSeed(info, 1, &salt))
    return info.Env().Undefined();
  return Napi::BigInt::New(info.Env(), prefix::SeedOf(p, len, salt));
}

}  // namespace

void InitPrefixIndex(Napi::Env env, Napi::Object exports) {
  exports.Set("PrefixIndex", PrefixIndexWrap::Define(env));
  exports.Set("prefixSeed", Napi::Function::New<PrefixSeed>(env, "prefixSeed"));
}

}  // namespace switchyard
