// Precise mode's ingest: applies a batch of engine KV events (BlockStored,
// BlockRemoved, AllBlocksCleared, already decoded and flattened by the TS
// subscriber) to a prefix::Index in one call. The router's key for a block is
// its own chained hash of the block's token ids (as little-endian uint32
// bytes, exactly what matchPrompt hashes at request time), chained from the
// parent block's key or, for a first block, from the (model, LoRA) seed. Each
// endpoint keeps engine hash -> (key, tiers held) so BlockRemoved, which names
// only engine hashes, finds the key; a block is in the index while any tier
// holds it, at the fastest tier that does.
//
// The map is bounded per endpoint (SetLimit, default kDefaultMapLimit): past
// the limit the least recently stored-or-used entry is forgotten AND its key is
// removed from the index, so the router never keeps claiming a block whose
// BlockRemoved it could no longer recognise (forgetting costs a miss, never a
// wrong "cached"). An entry is used when it is stored again or when a stored
// block names it as parent. No N-API types here.
#pragma once

#include <cstdint>
#include <deque>
#include <unordered_map>
#include <utility>
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
  double forgotten = 0;    // map entries forgotten over the limit (their keys removed from the index)
};

constexpr uint32_t kDefaultMapLimit = 1u << 20;

class EventMap {
 public:
  explicit EventMap(uint32_t max_endpoints) : maps_(max_endpoints) {}

  uint32_t max_endpoints() const { return static_cast<uint32_t>(maps_.size()); }

  // Entries kept per endpoint (>= 1); lowering it forgets the excess at the next store.
  void SetLimit(uint32_t limit) { limit_ = limit < 1 ? 1 : limit; }
  uint32_t limit() const { return limit_; }

  // Returns nullptr on success, else a message naming the bad record (nothing after it applied).
  const char* Apply(Index& index, size_t block_bytes, const uint32_t* ops, size_t n_ops, const uint32_t* words,
                    size_t n_words, const uint32_t* tokens, size_t n_tokens, EventTotals& t) {
    const size_t tpb = block_bytes / 4;
    for (size_t r = 0; r < n_ops; r++) {
      const uint32_t* op = ops + r * kOpWords;
      const uint32_t kind = op[0], ep = op[1], tier = op[2], n = op[3];
      if (ep >= maps_.size()) return "event op: endpoint out of range";
      if (tier >= static_cast<uint32_t>(kTiers)) return "event op: tier must be 0, 1 or 2";
      EpMap& em = maps_[ep];
      Map& m = em.map;
      if (kind == kOpCleared) {
        index.Clear(ep);
        em.Clear();
        continue;
      }
      const size_t w = op[6];
      if (kind == kOpStored) {
        if (w + 4 + 2 * static_cast<size_t>(n) > n_words) return "event op: words out of range";
        if (static_cast<size_t>(op[5]) + static_cast<size_t>(n) * tpb > n_tokens) return "event op: tokens out of range";
        uint64_t parent = Word(words + w);
        if (op[4] & 1) {
          const uint64_t ph = Word(words + w + 2);
          auto it = m.find(ph);
          if (it == m.end()) {
            t.orphans += n;
            continue;
          }
          parent = it->second.key;
          em.Use(ph, it->second);
        }
        const uint8_t* p = reinterpret_cast<const uint8_t*>(tokens + op[5]);
        const uint8_t bit = static_cast<uint8_t>(1u << tier);
        scratch_.clear();
        for (uint32_t i = 0; i < n; i++) {
          const uint64_t key = BlockHash(parent, p + i * block_bytes, block_bytes);
          parent = key;
          const uint64_t h = Word(words + w + 4 + 2 * i);
          Mapped& e = m[h];
          if (e.key != key) e = Mapped{key, 0, 0};
          em.Use(h, e);
          // Re-placed only when this tier is faster than every tier already holding it.
          if (e.tiers == 0 || bit < (e.tiers & -e.tiers)) scratch_.push_back(key);
          e.tiers |= bit;
        }
        if (!scratch_.empty()) index.Record(ep, scratch_.data(), scratch_.size(), static_cast<int>(tier));
        t.stored += n;
        if (m.size() > limit_) t.forgotten += em.Forget(index, ep, limit_);
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
    if (ep < maps_.size()) maps_[ep].Clear();
  }

  size_t Mapped_(uint32_t ep) const { return ep < maps_.size() ? maps_[ep].map.size() : 0; }

  size_t Bytes() const {
    size_t b = 0;
    for (const EpMap& e : maps_) {
      b += e.map.size() * (sizeof(uint64_t) + sizeof(Mapped) + 16) + e.map.bucket_count() * sizeof(void*);
      b += e.order.size() * sizeof(std::pair<uint64_t, uint64_t>);
    }
    return b;
  }

 private:
  struct Mapped {
    uint64_t key = 0;
    uint64_t stamp = 0;  // when it was last stored or used (EpMap::order holds (hash, stamp) in that order)
    uint8_t tiers = 0;   // bit t: tier t holds the block
  };
  using Map = std::unordered_map<uint64_t, Mapped>;

  // One endpoint's map and its use order. order may hold stale pairs (an entry used again later, or removed):
  // a pair counts only while its stamp is the entry's current one; the deque is compacted when stale pairs
  // outnumber live ones, so it stays within 2x the map plus a constant.
  struct EpMap {
    Map map;
    std::deque<std::pair<uint64_t, uint64_t>> order;
    uint64_t next = 0;

    void Clear() {
      map.clear();
      order.clear();
    }

    void Use(uint64_t hash, Mapped& e) {
      e.stamp = ++next;
      order.emplace_back(hash, e.stamp);
      if (order.size() > 2 * map.size() + 1024) Compact();
    }

    void Compact() {
      std::deque<std::pair<uint64_t, uint64_t>> live;
      for (const auto& [h, s] : order) {
        auto it = map.find(h);
        if (it != map.end() && it->second.stamp == s) live.emplace_back(h, s);
      }
      order.swap(live);
    }

    // Forgets least recently used entries until `limit` remain, removing their keys from the index.
    double Forget(Index& index, uint32_t ep, size_t limit) {
      double n = 0;
      while (map.size() > limit && !order.empty()) {
        const auto [h, s] = order.front();
        order.pop_front();
        auto it = map.find(h);
        if (it == map.end() || it->second.stamp != s) continue;
        index.Remove(ep, &it->second.key, 1);
        map.erase(it);
        n++;
      }
      return n;
    }
  };

  static uint64_t Word(const uint32_t* p) { return (static_cast<uint64_t>(p[0]) << 32) | p[1]; }

 public:
  // After a call: frees what one big event made the key scratch grow to (it keeps up to 8 MiB).
  void Trim() {
    if (scratch_.capacity() > (size_t{1} << 20)) std::vector<uint64_t>().swap(scratch_);
  }

 private:
  std::vector<EpMap> maps_;
  std::vector<uint64_t> scratch_;
  uint32_t limit_ = kDefaultMapLimit;
};

}  // namespace switchyard::prefix
