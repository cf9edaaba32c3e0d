// Precise mode's native decoder: engine KV-event batches as the raw msgpack
// payloads the ZMQ subscriber received (vLLM's schema: docs/kv-events.md,
// shared/reference/PROTOCOLS.md), decoded straight into the op records of
// kv_events.h, so a whole drain (payloads and clears, in order) is decoded and
// applied in one native call. Both event layouts (arrays with the tag first,
// maps with "type"), hashes as integers (any msgpack int: its 64 bits) or
// digest bytes (the last 8, big-endian). Every read is bounds-checked: a
// payload that is not well-formed msgpack, has bytes after its value, or is
// not a batch is "malformed" and contributes nothing but a clear of its
// holders. The acceptance rules mirror the TS reference decoder
// (src/kv-events/decode.ts, msgpackr) field by field; the deliberate
// differences (ext types and 0xc1 are opaque values here, `medium` is
// upper-cased in ASCII only, a LoRA name's seed is taken from its raw bytes)
// are listed in docs/kv-events.md. No N-API types here.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kv_events.h"
#include "prefix_hash.h"

namespace switchyard::prefix {

// The head of one msgpack value.
enum class MpKind : uint8_t { kNil, kBool, kInt, kFloat, kStr, kBin, kArray, kMap, kExt, kOther };

struct MpVal {
  MpKind kind = MpKind::kNil;
  bool neg = false;  // kInt: a negative int64 (bits in u)
  uint64_t u = 0;    // kInt: the 64 bits; kStr/kBin/kExt: byte length; kArray/kMap: element / pair count
  double f = 0;      // kFloat
  size_t data = 0;   // kStr/kBin: offset of the bytes; kArray/kMap: offset of the first element
};

// Total size in bytes of a value whose head byte alone fixes it (0: variable, or a container, or a kind a map
// key must not be: ext and 0xc1 go through Head).
struct FixedSizes {
  uint8_t v[256];
  constexpr FixedSizes() : v() {
    for (int b = 0x00; b <= 0x7f; b++) v[b] = 1;
    for (int b = 0xe0; b <= 0xff; b++) v[b] = 1;
    for (int b = 0xa0; b <= 0xbf; b++) v[b] = static_cast<uint8_t>(1 + (b & 0x1f));
    v[0xc0] = v[0xc2] = v[0xc3] = 1;
    v[0xca] = 5;
    v[0xcb] = 9;
    v[0xcc] = v[0xd0] = 2;
    v[0xcd] = v[0xd1] = 3;
    v[0xce] = v[0xd2] = 5;
    v[0xcf] = v[0xd3] = 9;
  }
  constexpr uint8_t operator[](uint8_t b) const { return v[b]; }
};
inline constexpr FixedSizes kFixedSize{};

// A bounds-checked msgpack reader over [p, p + n).
class MpReader {
 public:
  MpReader(const uint8_t* p, size_t n) : p_(p), n_(n) {}

  size_t size() const { return n_; }
  const uint8_t* bytes() const { return p_; }

  // Reads the head at *pos into v and moves *pos past it (past the bytes of a str, bin or ext; to the first
  // element of an array or map). False if the buffer ends first.
  bool Head(size_t* pos, MpVal* v) const {
    size_t i = *pos;
    if (i >= n_) return false;
    const uint8_t b = p_[i++];
    v->neg = false;
    if (b <= 0x7f) return Int(pos, i, v, b);
    if (b >= 0xe0) {
      v->kind = MpKind::kInt;
      v->neg = true;
      v->u = static_cast<uint64_t>(static_cast<int64_t>(static_cast<int8_t>(b)));
      *pos = i;
      return true;
    }
    if (b <= 0x8f) return Container(pos, i, v, MpKind::kMap, b & 0x0f);
    if (b <= 0x9f) return Container(pos, i, v, MpKind::kArray, b & 0x0f);
    if (b <= 0xbf) return Bytes(pos, i, v, MpKind::kStr, b & 0x1f);
    uint64_t x;
    switch (b) {
      case 0xc0: v->kind = MpKind::kNil; *pos = i; return true;
      case 0xc1: v->kind = MpKind::kOther; *pos = i; return true;  // "never used": msgpackr decodes it as an opaque object
      case 0xc2: case 0xc3: v->kind = MpKind::kBool; v->u = b & 1; *pos = i; return true;
      case 0xc4: return Be(i, 1, &x) && Bytes(pos, i + 1, v, MpKind::kBin, x);
      case 0xc5: return Be(i, 2, &x) && Bytes(pos, i + 2, v, MpKind::kBin, x);
      case 0xc6: return Be(i, 4, &x) && Bytes(pos, i + 4, v, MpKind::kBin, x);
      case 0xc7: return Be(i, 1, &x) && Bytes(pos, i + 2, v, MpKind::kExt, x);  // len, type, data
      case 0xc8: return Be(i, 2, &x) && Bytes(pos, i + 3, v, MpKind::kExt, x);
      case 0xc9: return Be(i, 4, &x) && Bytes(pos, i + 5, v, MpKind::kExt, x);
      case 0xca: {
        if (!Be(i, 4, &x)) return false;
        const uint32_t w = static_cast<uint32_t>(x);
        float f;
        std::memcpy(&f, &w, 4);
        v->kind = MpKind::kFloat;
        v->f = f;
        *pos = i + 4;
        return true;
      }
      case 0xcb: {
        if (!Be(i, 8, &x)) return false;
        std::memcpy(&v->f, &x, 8);
        v->kind = MpKind::kFloat;
        *pos = i + 8;
        return true;
      }
      case 0xcc: return Be(i, 1, &x) && Int(pos, i + 1, v, x);
      case 0xcd: return Be(i, 2, &x) && Int(pos, i + 2, v, x);
      case 0xce: return Be(i, 4, &x) && Int(pos, i + 4, v, x);
      case 0xcf: return Be(i, 8, &x) && Int(pos, i + 8, v, x);
      case 0xd0: return Be(i, 1, &x) && SInt(pos, i + 1, v, static_cast<int8_t>(x));
      case 0xd1: return Be(i, 2, &x) && SInt(pos, i + 2, v, static_cast<int16_t>(x));
      case 0xd2: return Be(i, 4, &x) && SInt(pos, i + 4, v, static_cast<int32_t>(x));
      case 0xd3: return Be(i, 8, &x) && SInt(pos, i + 8, v, static_cast<int64_t>(x));
      case 0xd4: return Bytes(pos, i + 1, v, MpKind::kExt, 1);  // fixext: type, data
      case 0xd5: return Bytes(pos, i + 1, v, MpKind::kExt, 2);
      case 0xd6: return Bytes(pos, i + 1, v, MpKind::kExt, 4);
      case 0xd7: return Bytes(pos, i + 1, v, MpKind::kExt, 8);
      case 0xd8: return Bytes(pos, i + 1, v, MpKind::kExt, 16);
      case 0xd9: return Be(i, 1, &x) && Bytes(pos, i + 1, v, MpKind::kStr, x);
      case 0xda: return Be(i, 2, &x) && Bytes(pos, i + 2, v, MpKind::kStr, x);
      case 0xdb: return Be(i, 4, &x) && Bytes(pos, i + 4, v, MpKind::kStr, x);
      case 0xdc: return Be(i, 2, &x) && Container(pos, i + 2, v, MpKind::kArray, x);
      case 0xdd: return Be(i, 4, &x) && Container(pos, i + 4, v, MpKind::kArray, x);
      case 0xde: return Be(i, 2, &x) && Container(pos, i + 2, v, MpKind::kMap, x);
      case 0xdf: return Be(i, 4, &x) && Container(pos, i + 4, v, MpKind::kMap, x);
      default: return false;  // unreachable: every byte is covered above
    }
  }

  // Moves *pos past one whole value (iteratively: no recursion, whatever the nesting). False if the value is
  // not well-formed: the buffer ends first, a container claims more elements than bytes remain, a map key is a
  // bin, array, map, ext or 0xc1 (msgpackr rejects those as property names), or nesting exceeds kMaxDepth.
  bool Skip(size_t* pos) {
    stack_.clear();
    uint64_t left = 1;  // values still to read in the innermost open container
    bool in_map = false;
    for (;;) {
      while (left == 0) {
        if (stack_.empty()) return true;
        left = stack_.back().left;
        in_map = stack_.back().map;
        stack_.pop_back();
      }
      const bool is_key = in_map && (left & 1) == 0;
      left--;
      // fast path: a value of fixed size (ints, floats, nil, bool, fixstr): no head to decode
      if (*pos < n_) {
        const uint8_t w = kFixedSize[p_[*pos]];
        if (w != 0) {
          if (w > n_ - *pos) return false;
          *pos += w;
          continue;
        }
      }
      MpVal v;
      if (!Head(pos, &v)) return false;
      if (is_key && (v.kind == MpKind::kBin || v.kind == MpKind::kArray || v.kind == MpKind::kMap ||
                     v.kind == MpKind::kExt || v.kind == MpKind::kOther))
        return false;
      if (v.kind == MpKind::kArray || v.kind == MpKind::kMap) {
        const uint64_t items = v.kind == MpKind::kMap ? 2 * v.u : v.u;
        if (items == 0) continue;
        if (stack_.size() >= kMaxDepth) return false;
        stack_.push_back(Frame{left, in_map});
        left = items;
        in_map = v.kind == MpKind::kMap;
      }
    }
  }

  static constexpr size_t kMaxDepth = 4096;

 private:

  struct Frame {
    uint64_t left;
    bool map;
  };

  bool Be(size_t i, size_t w, uint64_t* out) const {
    if (w > n_ || i > n_ - w) return false;
    uint64_t x = 0;
    for (size_t k = 0; k < w; k++) x = (x << 8) | p_[i + k];
    *out = x;
    return true;
  }
  bool Int(size_t* pos, size_t i, MpVal* v, uint64_t x) const {
    v->kind = MpKind::kInt;
    v->u = x;
    *pos = i;
    return true;
  }
  bool SInt(size_t* pos, size_t i, MpVal* v, int64_t x) const {
    v->kind = MpKind::kInt;
    v->neg = x < 0;
    v->u = static_cast<uint64_t>(x);
    *pos = i;
    return true;
  }
  // A str, bin or ext of len bytes starting at i (an ext's type byte sits at i - 1 and is not checked: any
  // type is an opaque value here).
  bool Bytes(size_t* pos, size_t i, MpVal* v, MpKind k, uint64_t len) const {
    if (i > n_ || len > n_ - i) return false;
    v->kind = k;
    v->u = len;
    v->data = i;
    *pos = i + static_cast<size_t>(len);
    return true;
  }
  // Each element takes at least one byte: a count beyond the bytes left is truncated input, caught here
  // before any loop runs that long.
  bool Container(size_t* pos, size_t i, MpVal* v, MpKind k, uint64_t count) const {
    const uint64_t items = k == MpKind::kMap ? 2 * count : count;
    if (i > n_ || items > n_ - i) return false;
    v->kind = k;
    v->u = count;
    v->data = i;
    *pos = i;
    return true;
  }

  const uint8_t* p_;
  size_t n_;
  std::vector<Frame> stack_;
};

// Counters of one decode call, added to the caller's totals.
struct DecodeTotals {
  double events = 0;         // events applied (queued as ops)
  double unknown_events = 0; // events of an unknown type, or not an array or map
  double bad_events = 0;     // a missing or mistyped field, a hash of the wrong width, token ids that do not fill the blocks
  double bad_hashes = 0;     // of bad_events: a block or parent hash that is not a 64-bit integer or >= 8 digest bytes
  double block_size_mismatch = 0;
  double dropped_ranks = 0;  // batches from a data-parallel rank with no holder
  double malformed = 0;      // payloads that are not a well-formed batch (their holders are cleared)
  double batches = 0;        // payloads decoded
};

// The item records of one call: 8 uint32 each, [kind, start, end, holder, rankOff, rankLen, seedHi, seedLo].
//   kind 1 = payload: data[start, end) is one msgpack batch; a batch with no data-parallel rank goes to
//            holder, one with rank r < rankLen to ranks[rankOff + r] (-1: no holder, dropped), any other rank
//            is dropped; seed (hi, lo) is the chain seed of blocks without a LoRA adapter.
//   kind 2 = clear: forget holder and every ranks[rankOff .. rankOff + rankLen) that is >= 0.
constexpr uint32_t kItemWords = 8;
enum : uint32_t { kItemPayload = 1, kItemClear = 2 };
enum : uint8_t { kStatusApplied = 0, kStatusMalformed = 1, kStatusDroppedRank = 2, kStatusClear = 3 };

class BatchDecoder {
 public:
  // Decodes items into ops/words/tokens (kv_events.h's op records, in item order). status[i] gets the outcome
  // of item i. block_tokens: the configured engine block size. Arguments (item ranges, holders) must have been
  // validated by the caller.
  void Decode(const uint8_t* data, const uint32_t* items, size_t n_items, const int32_t* ranks, uint32_t block_tokens,
              uint8_t* status, DecodeTotals& t) {
    ops.clear();
    words.clear();
    tokens.clear();
    block_tokens_ = block_tokens;
    for (size_t i = 0; i < n_items; i++) {
      const uint32_t* it = items + i * kItemWords;
      if (it[0] == kItemClear) {
        ClearHolders(it, ranks);
        status[i] = kStatusClear;
        continue;
      }
      MpReader r(data + it[1], it[2] - it[1]);
      seed_ = (static_cast<uint64_t>(it[6]) << 32) | it[7];
      int64_t ep;
      if (!Batch(r, it, ranks, &ep, t)) {
        t.malformed++;
        ClearHolders(it, ranks);
        status[i] = kStatusMalformed;
        continue;
      }
      t.batches++;
      status[i] = ep < 0 ? kStatusDroppedRank : kStatusApplied;
    }
  }

  std::vector<uint32_t> ops, words, tokens;

  // The most uint32 words one call's records may hold (ops + words + tokens: 128 MiB). A batch that would take
  // more is malformed (its holders are cleared): a frame of up to the subscriber's 64 MiB can expand ~4x here
  // (a 1-byte token id is a 4-byte word), and that must not be what sets the router's memory.
  static constexpr size_t kMaxDecodedWords = size_t{32} << 20;
  // What the records keep between calls (words per vector, 4 MiB): past a burst they are freed, not kept.
  static constexpr size_t kKeepWords = size_t{1} << 20;

  // After a call: gives back what a burst made the records grow to.
  void Trim() {
    for (auto* v : {&ops, &words, &tokens}) {
      if (v->capacity() > kKeepWords) std::vector<uint32_t>().swap(*v);
    }
  }

 private:
  bool oversize_ = false;  // the batch being decoded went over kMaxDecodedWords

  // Whether `more` words fit under kMaxDecodedWords (else the batch is marked oversize: malformed).
  bool Room(size_t more) {
    if (ops.size() + words.size() + tokens.size() + more <= kMaxDecodedWords) return true;
    oversize_ = true;
    return false;
  }

  // Field slots of an event, by name; npos when absent.
  enum Field { kHashes, kParent, kTokenIds, kBlockSize, kMedium, kLoraName, kFields };
  static constexpr size_t kAbsent = ~static_cast<size_t>(0);

  void ClearHolders(const uint32_t* it, const int32_t* ranks) {
    PushOp(kOpCleared, it[3]);
    for (uint32_t r = 0; r < it[5]; r++) {
      const int32_t h = ranks[it[4] + r];
      if (h >= 0 && static_cast<uint32_t>(h) != it[3]) PushOp(kOpCleared, static_cast<uint32_t>(h));
    }
  }

  uint32_t* PushOp(uint32_t kind, uint32_t ep) {
    const size_t o = ops.size();
    ops.resize(o + kOpWords, 0);
    ops[o] = kind;
    ops[o + 1] = ep;
    return ops.data() + o;
  }

  // A JS number in msgpackr's decoding (int64AsType 'auto'): a float, or an int in [-2^53, 2^53] (beyond
  // that msgpackr gives a bigint).
  static bool Number(const MpVal& v, double* d) {
    if (v.kind == MpKind::kFloat) {
      *d = v.f;
      return true;
    }
    if (v.kind != MpKind::kInt) return false;
    constexpr uint64_t k53 = uint64_t{1} << 53;
    if (v.neg) {
      const int64_t s = static_cast<int64_t>(v.u);
      if (s < -static_cast<int64_t>(k53)) return false;
      *d = static_cast<double>(s);
    } else {
      if (v.u > k53) return false;
      *d = static_cast<double>(v.u);
    }
    return true;
  }
  static bool IsInteger(double d) { return std::isfinite(d) && std::floor(d) == d; }

  // A block hash as 64 bits: an int as its bits, an integral float within 2^53, digest bytes (>= 8: the last 8).
  bool Hash(const MpReader& r, const MpVal& v, uint64_t* out) const {
    if (v.kind == MpKind::kInt) {
      *out = v.u;
      return true;
    }
    if (v.kind == MpKind::kFloat) {
      if (!IsInteger(v.f) || std::fabs(v.f) > 9007199254740992.0) return false;
      *out = static_cast<uint64_t>(static_cast<int64_t>(v.f));
      return true;
    }
    if (v.kind == MpKind::kBin && v.u >= 8) {
      const uint8_t* p = r.bytes() + v.data + v.u - 8;
      uint64_t x = 0;
      for (int k = 0; k < 8; k++) x = (x << 8) | p[k];
      *out = x;
      return true;
    }
    return false;
  }

  // medium: absent or nil -> 0; a string, upper-cased: GPU/HBM/DEVICE -> 0, CPU/HOST/CPU_TIER1 -> 1, else 2;
  // anything else -> -1 (a bad event).
  static int Tier(const MpReader& r, size_t pos) {
    if (pos == kAbsent) return 0;
    MpVal v;
    if (!r.Head(&pos, &v)) return -1;
    if (v.kind == MpKind::kNil) return 0;
    if (v.kind != MpKind::kStr) return -1;
    char up[10];
    if (v.u > sizeof(up)) return 2;
    for (size_t k = 0; k < v.u; k++) {
      const char c = static_cast<char>(r.bytes()[v.data + k]);
      up[k] = c >= 'a' && c <= 'z' ? static_cast<char>(c - 32) : c;
    }
    const auto is = [&](const char* s) { return std::strlen(s) == v.u && std::memcmp(up, s, v.u) == 0; };
    if (is("GPU") || is("HBM") || is("DEVICE")) return 0;
    if (is("CPU") || is("HOST") || is("CPU_TIER1")) return 1;
    return 2;
  }

  static bool StrIs(const MpReader& r, const MpVal& v, const char* s, size_t n) {
    return v.kind == MpKind::kStr && v.u == n && std::memcmp(r.bytes() + v.data, s, n) == 0;
  }

  // One batch [ts, events, data_parallel_rank]. False: malformed (nothing of it queued or counted).
  //
  // One pass: the events are decoded for the batch's default holder while the bytes are checked, then the
  // rank is read; a malformed batch rolls back what it queued, a batch of another rank has its ops re-aimed,
  // and a batch of a rank without a holder is decoded again with no holder (which counts differently).
  bool Batch(MpReader& r, const uint32_t* it, const int32_t* ranks, int64_t* ep_out, DecodeTotals& t) {
    oversize_ = false;
    const size_t ops0 = ops.size(), words0 = words.size(), tokens0 = tokens.size();
    const auto rollback = [&] {
      ops.resize(ops0);
      words.resize(words0);
      tokens.resize(tokens0);
      return false;
    };
    size_t pos = 0;
    MpVal top, ts, evs;
    double d;
    if (!r.Head(&pos, &top) || top.kind != MpKind::kArray || top.u < 2) return false;
    if (!r.Head(&pos, &ts) || !Number(ts, &d)) return false;
    if (!r.Head(&pos, &evs) || evs.kind != MpKind::kArray) return false;
    DecodeTotals local;
    int64_t ep = it[3];
    if (!Events(r, evs, ep, local, &pos)) return rollback();
    if (top.u >= 3) {
      MpVal dp;
      const size_t at = pos;
      if (!r.Head(&pos, &dp)) return rollback();
      if (dp.kind != MpKind::kNil) {
        double rank;
        if (!Number(dp, &rank) || !IsInteger(rank) || rank < 0) return rollback();
        ep = rank < static_cast<double>(it[5]) ? ranks[it[4] + static_cast<uint32_t>(rank)] : -1;
      }
      pos = at;
      for (uint64_t k = 2; k < top.u; k++) {
        if (!r.Skip(&pos)) return rollback();
      }
    }
    if (pos != r.size()) return rollback();  // bytes after the batch
    if (ep < 0) {
      // no holder: the events still count (bad, unknown, mismatched), nothing is queued
      rollback();
      local = DecodeTotals();
      size_t p2 = evs.data;
      Events(r, evs, -1, local, &p2);
      local.dropped_ranks++;
    } else if (ep != it[3]) {
      for (size_t o = ops0; o < ops.size(); o += kOpWords) ops[o + 1] = static_cast<uint32_t>(ep);
    }
    t.events += local.events;
    t.unknown_events += local.unknown_events;
    t.bad_events += local.bad_events;
    t.bad_hashes += local.bad_hashes;
    t.block_size_mismatch += local.block_size_mismatch;
    t.dropped_ranks += local.dropped_ranks;
    *ep_out = ep;
    return true;
  }

  // The events array at evs; *end gets the position after it. False if the bytes are not well-formed.
  bool Events(MpReader& r, const MpVal& evs, int64_t ep, DecodeTotals& t, size_t* end) {
    size_t pos = evs.data;
    for (uint64_t e = 0; e < evs.u; e++) {
      const size_t at = pos;
      MpVal ev;
      if (!r.Head(&pos, &ev)) return false;
      if (ev.kind == MpKind::kArray) {
        if (!ArrayEvent(r, ev, ep, t, &pos) || oversize_) return false;
        continue;
      }
      if (ev.kind == MpKind::kMap) {
        if (!MapEvent(r, ev, ep, t, &pos) || oversize_) return false;
        continue;
      }
      pos = at;
      if (!r.Skip(&pos)) return false;
      // msgpackr gives an object for bin, ext and 0xc1 too: an object without a "type" is an unknown event
      if (ev.kind == MpKind::kBin || ev.kind == MpKind::kExt || ev.kind == MpKind::kOther) t.unknown_events++;
      else t.bad_events++;
    }
    *end = pos;
    return true;
  }

  // Applies one array event; *end gets the position after it. False if its bytes are not well-formed.
  bool ArrayEvent(MpReader& r, const MpVal& ev, int64_t ep, DecodeTotals& t, size_t* end) {
    size_t f[8];
    size_t pos = ev.data;
    for (uint64_t k = 0; k < ev.u; k++) {
      if (k < 8) f[k] = pos;
      if (!r.Skip(&pos)) return false;
    }
    *end = pos;
    for (uint64_t k = ev.u; k < 8; k++) f[k] = kAbsent;
    MpVal tag;
    size_t p0 = f[0];
    if (p0 == kAbsent || !r.Head(&p0, &tag)) {
      t.unknown_events++;
      return true;
    }
    if (StrIs(r, tag, "BlockStored", 11)) {
      size_t fs[kFields] = {f[1], f[2], f[3], f[4], f[6], f[7]};
      Stored(r, fs, ep, t);
    } else if (StrIs(r, tag, "BlockRemoved", 12)) {
      Removed(r, f[1], f[2], ep, t);
    } else if (StrIs(r, tag, "AllBlocksCleared", 16)) {
      Cleared(ep, t);
    } else {
      t.unknown_events++;
    }
    return true;
  }

  // Applies one map event; *end gets the position after it. False if its bytes are not well-formed.
  bool MapEvent(MpReader& r, const MpVal& ev, int64_t ep, DecodeTotals& t, size_t* end) {
    size_t fs[kFields];
    for (size_t& x : fs) x = kAbsent;
    size_t type_pos = kAbsent;
    size_t pos = ev.data;
    for (uint64_t k = 0; k < ev.u; k++) {
      MpVal key;
      if (!r.Head(&pos, &key)) return false;
      if (key.kind == MpKind::kArray || key.kind == MpKind::kMap) return false;  // msgpackr: not a property name
      if (key.kind == MpKind::kBin || key.kind == MpKind::kExt || key.kind == MpKind::kOther) return false;
      const size_t val = pos;
      if (!r.Skip(&pos)) return false;
      if (key.kind != MpKind::kStr) continue;  // msgpackr names an int, float, bool or nil key by its text: never a field
      const char* s = reinterpret_cast<const char*>(r.bytes() + key.data);
      const size_t n = key.u;
      const auto is = [&](const char* name) { return std::strlen(name) == n && std::memcmp(s, name, n) == 0; };
      // a repeated key: the last one wins, as in msgpackr's objects
      if (is("type")) type_pos = val;
      else if (is("block_hashes")) fs[kHashes] = val;
      else if (is("parent_block_hash")) fs[kParent] = val;
      else if (is("token_ids")) fs[kTokenIds] = val;
      else if (is("block_size")) fs[kBlockSize] = val;
      else if (is("medium")) fs[kMedium] = val;
      else if (is("lora_name")) fs[kLoraName] = val;
    }
    *end = pos;
    MpVal tag;
    if (type_pos == kAbsent || !r.Head(&type_pos, &tag)) {
      t.unknown_events++;
      return true;
    }
    if (StrIs(r, tag, "BlockStored", 11)) Stored(r, fs, ep, t);
    else if (StrIs(r, tag, "BlockRemoved", 12)) Removed(r, fs[kHashes], fs[kMedium], ep, t);
    else if (StrIs(r, tag, "AllBlocksCleared", 16)) Cleared(ep, t);
    else t.unknown_events++;
    return true;
  }

  void Cleared(int64_t ep, DecodeTotals& t) {
    if (ep < 0) return;
    PushOp(kOpCleared, static_cast<uint32_t>(ep));
    t.events++;
  }

  // Reads the value at pos (kAbsent: an "absent" value of kind kOther that matches no test below).
  static bool At(const MpReader& r, size_t pos, MpVal* v) {
    if (pos == kAbsent) return false;
    return r.Head(&pos, v);
  }

  // The same checks, in the same order, as EventBatchEncoder's #stored (src/kv-events/decode.ts).
  void Stored(const MpReader& r, const size_t* fs, int64_t ep, DecodeTotals& t) {
    MpVal hashes, toks, bs, lora, parent;
    double bsd;
    if (!At(r, fs[kHashes], &hashes) || hashes.kind != MpKind::kArray || !At(r, fs[kTokenIds], &toks) ||
        toks.kind != MpKind::kArray || !At(r, fs[kBlockSize], &bs) || !Number(bs, &bsd) || !IsInteger(bsd) ||
        bsd < 1) {
      t.bad_events++;
      return;
    }
    const int tier = Tier(r, fs[kMedium]);
    const uint64_t n = hashes.u;
    const bool has_lora = At(r, fs[kLoraName], &lora) && lora.kind != MpKind::kNil;
    if (tier < 0 || static_cast<double>(toks.u) != static_cast<double>(n) * bsd ||
        (has_lora && lora.kind != MpKind::kStr)) {
      t.bad_events++;
      return;
    }
    if (bsd != static_cast<double>(block_tokens_)) {
      t.block_size_mismatch++;
      return;
    }
    if (ep < 0 || n == 0) return;
    if (!Room(4 + 2 * n + toks.u + kOpWords)) return;
    const bool has_parent = At(r, fs[kParent], &parent) && parent.kind != MpKind::kNil;
    const size_t w0 = words.size();
    words.resize(w0 + 4 + 2 * n);
    const uint64_t seed = has_lora && lora.u > 0 ? SeedOf(r.bytes() + lora.data, lora.u, 0) : seed_;
    words[w0] = static_cast<uint32_t>(seed >> 32);
    words[w0 + 1] = static_cast<uint32_t>(seed);
    uint64_t h = 0;
    if (has_parent && !Hash(r, parent, &h)) return BadHash(w0, t);
    words[w0 + 2] = static_cast<uint32_t>(h >> 32);
    words[w0 + 3] = static_cast<uint32_t>(h);
    size_t pos = hashes.data;
    for (uint64_t i = 0; i < n; i++) {
      MpVal hv;
      if (!r.Head(&pos, &hv) || !Hash(r, hv, &h)) return BadHash(w0, t);
      words[w0 + 4 + 2 * i] = static_cast<uint32_t>(h >> 32);
      words[w0 + 5 + 2 * i] = static_cast<uint32_t>(h);
    }
    const size_t t0 = tokens.size();
    tokens.resize(t0 + toks.u);
    pos = toks.data;
    const uint8_t* b = r.bytes();
    for (uint64_t i = 0; i < toks.u; i++) {
      // fast paths: a positive fixint, uint8, uint16 or uint32 (how engines write token ids)
      if (pos < r.size()) {
        const uint8_t h = b[pos];
        if (h <= 0x7f) {
          tokens[t0 + i] = h;
          pos++;
          continue;
        }
        if (h == 0xcd && r.size() - pos >= 3) {
          tokens[t0 + i] = (static_cast<uint32_t>(b[pos + 1]) << 8) | b[pos + 2];
          pos += 3;
          continue;
        }
        if (h == 0xce && r.size() - pos >= 5) {
          tokens[t0 + i] = (static_cast<uint32_t>(b[pos + 1]) << 24) | (static_cast<uint32_t>(b[pos + 2]) << 16) |
                           (static_cast<uint32_t>(b[pos + 3]) << 8) | b[pos + 4];
          pos += 5;
          continue;
        }
        if (h == 0xcc && r.size() - pos >= 2) {
          tokens[t0 + i] = b[pos + 1];
          pos += 2;
          continue;
        }
      }
      MpVal tv;
      double d;
      if (!r.Head(&pos, &tv) || !Number(tv, &d) || !IsInteger(d) || d < 0 || d > 4294967295.0) {
        words.resize(w0);
        tokens.resize(t0);
        t.bad_events++;
        return;
      }
      tokens[t0 + i] = static_cast<uint32_t>(d);
    }
    uint32_t* op = PushOp(kOpStored, static_cast<uint32_t>(ep));
    op[2] = static_cast<uint32_t>(tier);
    op[3] = static_cast<uint32_t>(n);
    op[4] = has_parent ? 1 : 0;
    op[5] = static_cast<uint32_t>(t0);
    op[6] = static_cast<uint32_t>(w0);
    t.events++;
  }

  void BadHash(size_t w0, DecodeTotals& t) {
    words.resize(w0);
    t.bad_events++;
    t.bad_hashes++;
  }

  void Removed(const MpReader& r, size_t hashes_pos, size_t medium_pos, int64_t ep, DecodeTotals& t) {
    MpVal hashes;
    const int tier = Tier(r, medium_pos);
    if (!At(r, hashes_pos, &hashes) || hashes.kind != MpKind::kArray || tier < 0) {
      t.bad_events++;
      return;
    }
    const uint64_t n = hashes.u;
    if (ep < 0 || n == 0) return;
    if (!Room(2 * n + kOpWords)) return;
    const size_t w0 = words.size();
    words.resize(w0 + 2 * n);
    size_t pos = hashes.data;
    uint64_t h;
    for (uint64_t i = 0; i < n; i++) {
      MpVal hv;
      if (!r.Head(&pos, &hv) || !Hash(r, hv, &h)) return BadHash(w0, t);
      words[w0 + 2 * i] = static_cast<uint32_t>(h >> 32);
      words[w0 + 2 * i + 1] = static_cast<uint32_t>(h);
    }
    uint32_t* op = PushOp(kOpRemoved, static_cast<uint32_t>(ep));
    op[2] = static_cast<uint32_t>(tier);
    op[3] = static_cast<uint32_t>(n);
    op[6] = static_cast<uint32_t>(w0);
    t.events++;
  }

  uint32_t block_tokens_ = 16;
  uint64_t seed_ = 0;
};

}  // namespace switchyard::prefix
