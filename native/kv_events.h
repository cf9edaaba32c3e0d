// Precise mode's ingest: applies a batch of engine KV events (BlockStored,
// BlockRemoved, AllBlocksCleared, already decoded and flattened by the TS
// subscriber) to a prefix::Index in one call. The router's key for a block is
// its own chained hash of the block's token ids (as little-endian uint32
// bytes, exactly what matchPrompt hashes at request time), chained from the
// parent block's key or, for a first block, from the (model, LoRA) seed. Each
// endpoint keeps engine hash -> (key, tiers held) so BlockRemoved, which names
// only engine hashes, finds the key; a block is in the index while any tier
// holds it, at the fastest tier that does. No N-API types here.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "prefix_core.h"
#include "prefix_hash.h"

namespace switchyard::prefix {

// Op records: 8 uint32 each.
//   [kind, ep, tier, n, flags, tokenOffset, wordOffset, 0]
// kind 1 = stored: words[wordOffset..] = seedHi, seedLo, parentHi, parentLo, then n (hi, lo) engine
//          hashes; tokens[tokenOffset..] = n * tokensPerBlock token ids; flags bit 0 = has parent.
// kind 2 = removed (tier = the medium it was removed from): words = n (hi, lo) engine hashes.
// kind 3 = all cleared.
constexpr uint32_t kOpWords = 8;
enum : uint32_t { kOpStored = 1, kOpRemoved = 2, kOpCleared = 3 };

struct EventTotals {
  double stored = 0;       // blocks applied from BlockStored
  double removed = 0;      // blocks applied from BlockRemoved
  double orphans = 0;      // stored blocks whose parent the endpoint does not hold (skipped)
  double unknown = 0;      // removed blocks never stored (ignored)
};

class EventMap {
 public:
  explicit EventMap(uint32_t max_endpoints) : maps_(max_endpoints) {}

  // Returns nullptr on success, else a message naming the bad record (nothing after it applied).
  const char* Apply(Index& index, size_t block_bytes, const uint32_t* ops, size_t n_ops, const uint32_t* words,
                    size_t n_words, const uint32_t* tokens, size_t n_tokens, EventTotals& t) {
    const size_t tpb = block_bytes / 4;
    for (size_t r = 0; r < n_ops; r++) {
      const uint32_t* op = ops + r * kOpWords;
      const uint32_t kind = op[0], ep = op[1], tier = op[2], n = op[3];
      if (ep >= maps_.size()) return "event op: endpoint out of range";
      if (tier >= static_cast<uint32_t>(kTiers)) return "event op: tier must be 0, 1 or 2";
      Map& m = maps_[ep];
      if (kind == kOpCleared) {
        index.Clear(ep);
        m.clear();
        continue;
      }
      const size_t w = op[6];
      if (kind == kOpStored) {
        if (w + 4 + 2 * static_cast<size_t>(n) > n_words) return "event op: words out of range";
        if (static_cast<size_t>(op[5]) + static_cast<size_t>(n) * tpb > n_tokens) return "event op: tokens out of range";
        uint64_t parent = Word(words + w);
        if (op[4] & 1) {
          auto it = m.find(Word(words + w + 2));
          if (it == m.end()) {
            t.orphans += n;
            continue;
          }
          parent = it->second.key;
        }
        const uint8_t* p = reinterpret_cast<const uint8_t*>(tokens + op[5]);
        const uint8_t bit = static_cast<uint8_t>(1u << tier);
        scratch_.clear();
        for (uint32_t i = 0; i < n; i++) {
          const uint64_t key = BlockHash(parent, p + i * block_bytes, block_bytes);
          parent = key;
          Mapped& e = m[Word(words + w + 4 + 2 * i)];
          if (e.key != key) e = Mapped{key, 0};
          // Re-placed only when this tier is faster than every tier already holding it.
          if (e.tiers == 0 || bit < (e.tiers & -e.tiers)) scratch_.push_back(key);
          e.tiers |= bit;
        }
        if (!scratch_.empty()) index.Record(ep, scratch_.data(), scratch_.size(), static_cast<int>(tier));
        t.stored += n;
        continue;
      }
      if (kind == kOpRemoved) {
        if (w + 2 * static_cast<size_t>(n) > n_words) return "event op: words out of range";
        const uint8_t bit = static_cast<uint8_t>(1u << tier);
        for (uint32_t i = 0; i < n; i++) {
          auto it = m.find(Word(words + w + 2 * i));
          if (it == m.end() || !(it->second.tiers & bit)) {
            t.unknown++;
            continue;
          }
          Mapped& e = it->second;
          const uint8_t before = e.tiers & -e.tiers;
          e.tiers &= static_cast<uint8_t>(~bit);
          if (e.tiers == 0) {
            index.Remove(ep, &e.key, 1);
            m.erase(it);
          } else if (before == bit) {
            // the fastest copy went away: the block is now served from the next tier that holds it
            index.Record(ep, &e.key, 1, __builtin_ctz(e.tiers));
          }
          t.removed++;
        }
        continue;
      }
      return "event op: unknown kind";
    }
    return nullptr;
  }

  void Clear(uint32_t ep) {
    if (ep < maps_.size()) maps_[ep].clear();
  }

  size_t Mapped_(uint32_t ep) const { return ep < maps_.size() ? maps_[ep].size() : 0; }

  size_t Bytes() const {
    size_t b = 0;
    for (const Map& m : maps_) b += m.size() * (sizeof(uint64_t) + sizeof(Mapped) + 16) + m.bucket_count() * sizeof(void*);
    return b;
  }

 private:
  struct Mapped {
    uint64_t key = 0;
    uint8_t tiers = 0;  // bit t: tier t holds the block
  };
  using Map = std::unordered_map<uint64_t, Mapped>;

  static uint64_t Word(const uint32_t* p) { return (static_cast<uint64_t>(p[0]) << 32) | p[1]; }

  std::vector<Map> maps_;
  std::vector<uint64_t> scratch_;
};

}  // namespace switchyard::prefix
