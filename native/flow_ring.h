// Bounded lock-free FIFO ring for one flow's queued requests.
//
// Any number of threads may push; pops are safe from several threads too, but
// Switchyard uses one consumer (the dispatch loop on the main thread), which
// is what Peek() assumes. Each cell carries a sequence number that says whose
// turn it is: a producer may fill cell (pos & mask) when seq == pos, a
// consumer may empty it when seq == pos + 1; emptying sets seq to
// pos + capacity, handing the cell to the producer of the next lap. Positions
// are 64-bit, so they never wrap in practice.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <new>

namespace switchyard::flow {

// One queued request as native code sees it: JS keeps the payload, keyed by id.
struct Record {
  uint64_t id;
  uint32_t bytes;
  uint32_t time;
};

class Ring {
 public:
  // capacity must be a power of two, >= 2. Check ok(): the cells are
  // allocated without exceptions and may be missing when memory runs out.
  explicit Ring(uint32_t capacity) : mask_(capacity - 1), cells_(new (std::nothrow) Cell[capacity]) {
    if (!cells_) return;
    for (uint64_t i = 0; i < capacity; i++) cells_[i].seq.store(i, std::memory_order_relaxed);
  }

  bool ok() const noexcept { return cells_ != nullptr; }

  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;

  // Returns false when the ring is full.
  bool TryPush(const Record& r) noexcept {
    uint64_t pos = head_.load(std::memory_order_relaxed);
    Cell* cell;
    for (;;) {
      cell = &cells_[pos & mask_];
      const uint64_t seq = cell->seq.load(std::memory_order_acquire);
      const int64_t dif = static_cast<int64_t>(seq - pos);
      if (dif == 0) {
        if (head_.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) break;
      } else if (dif < 0) {
        return false;  // the consumer has not emptied this cell yet: full
      } else {
        pos = head_.load(std::memory_order_relaxed);
      }
    }
    cell->id.store(r.id, std::memory_order_relaxed);
    cell->meta.store(static_cast<uint64_t>(r.bytes) | (static_cast<uint64_t>(r.time) << 32),
                     std::memory_order_relaxed);
    cell->seq.store(pos + 1, std::memory_order_release);
    return true;
  }

  // Returns false when no published record is at the head (empty, or the
  // producer that claimed the head slot has not finished writing it).
  bool TryPop(Record* out) noexcept {
    uint64_t pos = tail_.load(std::memory_order_relaxed);
    Cell* cell;
    for (;;) {
      cell = &cells_[pos & mask_];
      const uint64_t seq = cell->seq.load(std::memory_order_acquire);
      const int64_t dif = static_cast<int64_t>(seq - (pos + 1));
      if (dif == 0) {
        if (tail_.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) break;
      } else if (dif < 0) {
        return false;
      } else {
        pos = tail_.load(std::memory_order_relaxed);
      }
    }
    Read(*cell, out);
    cell->seq.store(pos + mask_ + 1, std::memory_order_release);
    return true;
  }

  // Pushes up to n records with one claim of the head position: claims the
  // longest run of free cells (at most n) and publishes them in order.
  // Returns how many were pushed (0 when full).
  uint32_t TryPushMany(const uint32_t* words, uint32_t n) noexcept {
    uint32_t done = 0;
    while (done < n) {
      uint64_t pos = head_.load(std::memory_order_relaxed);
      uint32_t run = 0;
      const uint32_t want = n - done;
      while (run < want && cells_[(pos + run) & mask_].seq.load(std::memory_order_acquire) == pos + run) run++;
      if (run == 0) {
        // Either full, or another producer moved head: tell the two apart.
        const uint64_t seq = cells_[pos & mask_].seq.load(std::memory_order_acquire);
        if (static_cast<int64_t>(seq - pos) < 0) return done;
        continue;
      }
      if (!head_.compare_exchange_weak(pos, pos + run, std::memory_order_relaxed)) continue;
      for (uint32_t k = 0; k < run; k++, done++) {
        Cell& cell = cells_[(pos + k) & mask_];
        const uint32_t* w = words + static_cast<size_t>(done) * 4;
        cell.id.store(static_cast<uint64_t>(w[0]) | (static_cast<uint64_t>(w[1]) << 32), std::memory_order_relaxed);
        cell.meta.store(static_cast<uint64_t>(w[2]) | (static_cast<uint64_t>(w[3]) << 32), std::memory_order_relaxed);
        cell.seq.store(pos + k + 1, std::memory_order_release);
      }
    }
    return done;
  }

  // Pops up to n published records with one claim of the tail position,
  // writing them as [idLow, idHigh, bytes, time] words. Returns how many.
  uint32_t TryPopMany(uint32_t* words, uint32_t n) noexcept {
    uint32_t done = 0;
    while (done < n) {
      uint64_t pos = tail_.load(std::memory_order_relaxed);
      uint32_t run = 0;
      const uint32_t want = n - done;
      while (run < want && cells_[(pos + run) & mask_].seq.load(std::memory_order_acquire) == pos + run + 1) run++;
      if (run == 0) {
        const uint64_t seq = cells_[pos & mask_].seq.load(std::memory_order_acquire);
        if (static_cast<int64_t>(seq - (pos + 1)) < 0) return done;
        continue;
      }
      if (!tail_.compare_exchange_weak(pos, pos + run, std::memory_order_relaxed)) continue;
      for (uint32_t k = 0; k < run; k++, done++) {
        Cell& cell = cells_[(pos + k) & mask_];
        Record r;
        Read(cell, &r);
        cell.seq.store(pos + k + mask_ + 1, std::memory_order_release);
        uint32_t* w = words + static_cast<size_t>(done) * 4;
        w[0] = static_cast<uint32_t>(r.id);
        w[1] = static_cast<uint32_t>(r.id >> 32);
        w[2] = r.bytes;
        w[3] = r.time;
      }
    }
    return done;
  }

  // Reads the head record without removing it. Exact only for the single
  // consumer (no concurrent pops); concurrent pushes are fine.
  bool Peek(Record* out) const noexcept {
    const uint64_t pos = tail_.load(std::memory_order_relaxed);
    const Cell& cell = cells_[pos & mask_];
    if (cell.seq.load(std::memory_order_acquire) != pos + 1) return false;
    Read(cell, out);
    return true;
  }

  // Claimed-but-unpublished pushes count, so this can briefly exceed the
  // number of poppable records; it never exceeds the capacity.
  uint32_t SizeApprox() const noexcept {
    const uint64_t tail = tail_.load(std::memory_order_acquire);
    const uint64_t head = head_.load(std::memory_order_acquire);
    if (head <= tail) return 0;
    const uint64_t n = head - tail;
    return n > mask_ + 1 ? static_cast<uint32_t>(mask_ + 1) : static_cast<uint32_t>(n);
  }

  uint32_t Capacity() const noexcept { return static_cast<uint32_t>(mask_ + 1); }

 private:
  struct Cell {
    std::atomic<uint64_t> seq;
    // Relaxed atomics (plain moves on x86/arm64) so a racing Peek is not UB.
    std::atomic<uint64_t> id{0};
    std::atomic<uint64_t> meta{0};
  };

  static void Read(const Cell& cell, Record* out) noexcept {
    out->id = cell.id.load(std::memory_order_relaxed);
    const uint64_t meta = cell.meta.load(std::memory_order_relaxed);
    out->bytes = static_cast<uint32_t>(meta);
    out->time = static_cast<uint32_t>(meta >> 32);
  }

  alignas(64) std::atomic<uint64_t> head_{0};  // next position to push
  alignas(64) std::atomic<uint64_t> tail_{0};  // next position to pop
  alignas(64) const uint64_t mask_;
  const std::unique_ptr<Cell[]> cells_;
};

}  // namespace switchyard::flow
