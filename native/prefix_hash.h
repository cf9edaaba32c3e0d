// Switchyard's chained block hash (approximate prefix mode).
//
// A prompt is cut into fixed-size blocks; only full blocks are hashed. Each
// block's 64-bit hash covers its parent's hash (the seed for the first block)
// and the block's bytes, so one hash names a whole prefix. A block is split
// into its body (all but its last 16 bytes) and its last 16 bytes (l0, l1):
//
//   (a[i], b[i]) = Lanes(body of block i)        two 64-bit lanes (see LanesOf)
//   h[i] = Fold(h[i-1] ^ a[i] ^ l0[i], b[i] ^ l1[i] ^ P3),  h[-1] = seed
//
// (a block shorter than 16 bytes has an empty body and its bytes, zero-padded
// to 16, as (l0, l1)). Fold(x, y) is the 128-bit product x*y folded to 64
// bits (low ^ high), the core step of wyhash-style hashes. Words are read
// little-endian (byte-swapped on big-endian hosts). The lanes of different
// blocks are independent of each other, so the CPU computes them for many
// blocks at once; the chain is the one multiply per block that also takes
// the block's last 16 bytes, the only serial step. A 64-byte block costs four
// multiplies, one per 16 bytes. This is a fast, non-cryptographic hash: a
// collision, or a prompt crafted to collide, only costs a mis-scored cache
// affinity. test/reference/prefix-index-model.ts implements the same function
// with BigInt and the property tests compare the two bit for bit.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace switchyard::prefix {

constexpr uint64_t kP0 = 0xa0761d6478bd642fULL;
constexpr uint64_t kP1 = 0xe7037ed1a0b428dbULL;
constexpr uint64_t kP2 = 0x8ebc6af09c88c6e3ULL;
constexpr uint64_t kP3 = 0x589965cc75374cc3ULL;

inline uint64_t Fold(uint64_t a, uint64_t b) {
  const __uint128_t r = static_cast<__uint128_t>(a) * b;
  return static_cast<uint64_t>(r) ^ static_cast<uint64_t>(r >> 64);
}

inline uint64_t Load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  v = __builtin_bswap64(v);
#endif
  return v;
}

// The two lanes of n bytes, independent of their position:
//   a = P0, b = P1
//   per 32 bytes: a = Fold(w0 ^ P1, w1 ^ a); b = Fold(w2 ^ P2, w3 ^ b)
//   then 16 bytes if left: a = Fold(w0 ^ P1, w1 ^ a)
//   then 1..15 bytes if left, zero-padded to 16: b = Fold(w0 ^ P2, w1 ^ b)
struct Lanes {
  uint64_t a, b;
};

inline Lanes LanesOf(const uint8_t* p, size_t n) {
  uint64_t a = kP0, b = kP1;
  size_t i = 0;
  for (; n - i >= 32; i += 32) {
    a = Fold(Load64(p + i) ^ kP1, Load64(p + i + 8) ^ a);
    b = Fold(Load64(p + i + 16) ^ kP2, Load64(p + i + 24) ^ b);
  }
  if (n - i >= 16) {
    a = Fold(Load64(p + i) ^ kP1, Load64(p + i + 8) ^ a);
    i += 16;
  }
  if (n - i > 0) {
    uint8_t tail[16] = {0};
    std::memcpy(tail, p + i, n - i);
    b = Fold(Load64(tail) ^ kP2, Load64(tail + 8) ^ b);
  }
  return {a, b};
}

// One link of the chain for the seed: Fold(parent ^ a, b ^ P3).
inline uint64_t Link(uint64_t parent, Lanes l) { return Fold(parent ^ l.a, l.b ^ kP3); }

// The hash of a block of n bytes whose parent hashes to `parent` (see top).
inline uint64_t BlockHash(uint64_t parent, const uint8_t* p, size_t n) {
  const size_t body = n >= 16 ? n - 16 : 0;
  const Lanes l = LanesOf(p, body);
  uint64_t l0, l1;
  if (n >= 16) {
    l0 = Load64(p + body);
    l1 = Load64(p + body + 8);
  } else {
    uint8_t last[16] = {0};
    std::memcpy(last, p, n);
    l0 = Load64(last);
    l1 = Load64(last + 8);
  }
  return Fold(parent ^ l.a ^ l0, l.b ^ l1 ^ kP3);
}

// Hashes the full blocks of [p, p+len) chained from `seed` into out[0..count);
// returns count = len / block_size. The caller guarantees out has room.
// The prompt's bytes are prefetched kPromptAhead bytes ahead of the block
// being hashed: a prompt that is not in cache streams in from memory, and
// the hardware prefetcher alone (which restarts at every 4 KiB page) left
// the hash waiting on it (measured: 32 KiB from memory 3.8-4.2 us -> 1.2-1.6 us,
// the same as from cache).
constexpr size_t kPromptAhead = 4096;

inline size_t HashPrompt(const uint8_t* p, size_t len, size_t block_size, uint64_t seed, uint64_t* out) {
  const size_t count = len / block_size;
  size_t fetched = 0;  // prompt bytes [0, fetched) requested, in 64-byte lines
  uint64_t h = seed;
  for (size_t b = 0; b < count; b++) {
    const size_t upto = std::min(len, (b + 1) * block_size + kPromptAhead);
    for (; fetched < upto; fetched += 64) __builtin_prefetch(p + fetched);
    h = BlockHash(h, p + b * block_size, block_size);
    out[b] = h;
  }
  return count;
}

// The chain seed of a model name (any length) and a cache salt:
//   Fold(Link(salt, Lanes(name)) ^ P1, length ^ P2)
inline uint64_t SeedOf(const uint8_t* p, size_t n, uint64_t salt) {
  return Fold(Link(salt, LanesOf(p, n)) ^ kP1, static_cast<uint64_t>(n) ^ kP2);
}

}  // namespace switchyard::prefix
