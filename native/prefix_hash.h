// Switchyard's chained block hash (approximate prefix mode).
//
// A prompt is cut into fixed-size blocks; only full blocks are hashed. Each
// block's 64-bit hash covers its parent's hash (the seed for the first block)
// and the block's bytes, so one hash names a whole prefix:
//
//   content(block) : two lanes folded over 32-byte strides (see below)
//   h[i] = Fold(Fold(content(block[i]) ^ P3, h[i-1] ^ P0) ^ P1, P2),  h[-1] = seed
//
// Fold(a, b) is the 128-bit product a*b folded to 64 bits (low ^ high), the
// core step of wyhash-style hashes. Words are read little-endian. The content
// hash of different blocks is independent, so the CPU overlaps their work;
// only the two Fold steps of the chain are serial. This is a fast,
// non-cryptographic hash: a collision only costs a mis-scored cache affinity.
// test/reference/prefix-index-model.ts implements the same function with
// BigInt and the property tests compare the two bit for bit.
#pragma once
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

// Hash of one block's bytes, independent of its position.
//   lane0 = P0, lane1 = P1
//   per 32 bytes: lane0 = Fold(w0 ^ P1, w1 ^ lane0); lane1 = Fold(w2 ^ P2, w3 ^ lane1)
//   then 16 bytes if left: lane0 = Fold(w0 ^ P1, w1 ^ lane0)
//   then 1..15 bytes if left, zero-padded to 16: lane1 = Fold(w0 ^ P2, w1 ^ lane1)
//   content = Fold(lane0 ^ P2, lane1 ^ n)
inline uint64_t ContentHash(const uint8_t* p, size_t n) {
  uint64_t lane0 = kP0, lane1 = kP1;
  size_t i = 0;
  for (; n - i >= 32; i += 32) {
    lane0 = Fold(Load64(p + i) ^ kP1, Load64(p + i + 8) ^ lane0);
    lane1 = Fold(Load64(p + i + 16) ^ kP2, Load64(p + i + 24) ^ lane1);
  }
  if (n - i >= 16) {
    lane0 = Fold(Load64(p + i) ^ kP1, Load64(p + i + 8) ^ lane0);
    i += 16;
  }
  if (n - i > 0) {
    uint8_t tail[16] = {0};
    std::memcpy(tail, p + i, n - i);
    lane1 = Fold(Load64(tail) ^ kP2, Load64(tail + 8) ^ lane1);
  }
  return Fold(lane0 ^ kP2, lane1 ^ static_cast<uint64_t>(n));
}

inline uint64_t ChainHash(uint64_t parent, uint64_t content) {
  return Fold(Fold(content ^ kP3, parent ^ kP0) ^ kP1, kP2);
}

// Hashes the full blocks of [p, p+len) chained from `seed` into out[0..count);
// returns count = len / block_size. The caller guarantees out has room.
inline size_t HashPrompt(const uint8_t* p, size_t len, size_t block_size, uint64_t seed, uint64_t* out) {
  const size_t count = len / block_size;
  uint64_t h = seed;
  for (size_t b = 0; b < count; b++) {
    h = ChainHash(h, ContentHash(p + b * block_size, block_size));
    out[b] = h;
  }
  return count;
}

}  // namespace switchyard::prefix
