// The native upstream client's connections, pools and timeouts on a libuv
// loop, apart from the N-API binding (upstream_client.cc) and the response
// parser (h1_parser.h): keep-alive TCP connections per endpoint, one request
// at a time per connection, calls waiting for a free connection in a queue per
// pool, one coarse timer per client, and response events queued as records
// that the host (the binding) delivers to JavaScript in batches.
//
// Crossing into JavaScript: every response event (headers, a body piece, end,
// error) is appended to a native queue; the queue is copied into a shared
// Int32Array and handed to one JS callback per loop turn (from a uv_check
// handle, after the poll phase), or sooner when the read arena runs low.
// Response bytes are read straight into a shared arena (a JS Buffer); body
// events name [offset, length) ranges of it, so a body is never copied on the
// way to JS. Chunked bodies are de-chunked in place (framing bytes are
// squeezed out by moving data backwards), so one read yields at most one body
// event per call.
//
// Calls are named by ids the JS side picks: slot | generation << 20. Events
// of an id the JS side no longer knows (aborted, reused slot) are dropped
// there, so nothing has to be purged from the queue here.
//
// Timeouts: one coarse uv_timer per client checks every connection's last
// progress against its phase's limit: connect, the complete response head,
// body inactivity.
// A call that waits for a free connection (every connectionsPerEndpoint one
// busy) is under the headers limit from the moment it was sent: the wait
// counts, so it fails when its complete head did not arrive within the limit,
// queued or not (1xx interim heads and bytes of an incomplete head do not
// restart it).
#pragma once

#include <uv.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "h1_parser.h"

namespace switchyard {
namespace upstream {

constexpr size_t kReadSize = 64 * 1024;
constexpr size_t kMinArena = 4 * kReadSize;
constexpr uint32_t kSlotBits = 20;
constexpr uint32_t kSlotMask = (1u << kSlotBits) - 1;
constexpr uint64_t kIdleKeepAliveMs = 4000;  // below the 10 s idle timeout of uWS-based engines
constexpr size_t kMaxInterned = 256;
constexpr size_t kShrinkAbove = 1 << 20;

enum : int32_t { kEvHead = 1, kEvData = 2, kEvEnd = 3, kEvError = 4 };
// Error reasons (the JS side turns them into messages and codes).
enum : int32_t {
  kRConnect = 1,
  kRConnectTimeout = 2,
  kRTimeout = 3,
  kRClosed = 4,
  kRIo = 5,
  kRBadStatus = 6,
  kRHeadTooLarge = 7,
  kRBadChunk = 8,
  kRBadLength = 9,
  kRUnexpected = 10,
  kRClientClosed = 11,
  kRQueueTimeout = 12,
};

static_assert(kRBadStatus == static_cast<int32_t>(h1::Error::BadStatus) && kRHeadTooLarge == static_cast<int32_t>(h1::Error::HeadTooLarge) &&
                  kRBadChunk == static_cast<int32_t>(h1::Error::BadChunk) && kRBadLength == static_cast<int32_t>(h1::Error::BadLength) &&
                  kRUnexpected == static_cast<int32_t>(h1::Error::Unexpected),
              "the parser's errors are the client's error reasons");

// One event record as the JS side reads it: Int32Array words 0-3, Float64 at
// byte 16, words 6-7.
struct Event {
  int32_t type, id, a, b;
  double f;
  int32_t c, d;
};
static_assert(sizeof(Event) == 32, "event records are 32 bytes");

// The side that owns the shared buffers and the JavaScript callback (upstream_client.cc).
class CoreHost {
 public:
  virtual ~CoreHost() = default;
  // n event records are in the shared event buffer: hand them to JavaScript.
  virtual void DeliverEvents(size_t n) = 0;
  // The core is shutting down: no more deliveries; the shared buffers may go.
  virtual void ReleaseShared() = 0;
  // Every handle has closed; the core is deleted right after this returns.
  virtual void CoreFinished() = 0;
};

class Core;
struct Pool;
struct Conn;

struct Call {
  int32_t id = -1;  // -1: free
  Pool* pool = nullptr;
  Conn* conn = nullptr;
  std::string out;  // the request while it waits for a connection
  uint64_t queued_at = 0;  // loop time it joined its pool's queue (valid while queued)
  bool queued = false;
  bool paused = false;
};

struct Pool {
  sockaddr_storage addr{};
  uint32_t open = 0;
  bool closed = false;  // ClosePool: its endpoint is gone; connections close as their calls end
  std::vector<Conn*> idle;
  std::deque<int32_t> queue;  // waiting call ids (stale ids are skipped)
};

struct Conn {
  uv_tcp_t tcp;
  uv_connect_t creq;
  uv_write_t wreq;
  Core* core = nullptr;
  Pool* pool = nullptr;
  Call* call = nullptr;
  Conn* prev = nullptr;
  Conn* next = nullptr;
  std::string out;  // request bytes the socket has not taken yet (owned until the write completes)
  size_t out_off = 0;
  h1::ResponseParser parser;
  uint64_t active_at = 0;
  uint64_t waited = 0;  // how long the current call waited in the queue (ms; counts toward its headers limit)
  uint32_t limit_ms = 0;
  bool connected = false;
  bool reused = false;
  bool got_bytes = false;
  bool closing = false;
  bool writing = false;
  bool reading = false;
  bool in_idle = false;

  void Start(Call* c, const char* hp, size_t hl, const uint8_t* bp, size_t bl);
  void WriteOut();
  void TryWrite(const char* hp, size_t hl, const uint8_t* bp, size_t bl);
  void OnBytes(char* p, size_t n);
  void OnHead(const h1::Head& h);
  void OnBody(char* p, size_t n) { core_push_data(p, n); }
  void core_push_data(char* p, size_t n);
  void Complete(bool extra_bytes);
  void Fail(int err, int32_t reason);
  void OnEof();
  void Close();
  void Check(uint64_t now, uint32_t slack);
  void SetReading(bool on);
};

class Core {
 public:
  explicit Core(uv_loop_t* loop) : loop_(loop) {}

  // events: the shared event buffer (cap records); arena: the shared read arena.
  // Both stay valid until the host's ReleaseShared(). The core frees itself after
  // the last handle closed (Shutdown), telling the host with CoreFinished().
  void Init(CoreHost* host, Event* events, size_t cap, char* arena, size_t arena_size) {
    host_ = host;
    ev_ptr_ = events;
    ev_cap_ = cap;
    arena_ = arena;
    arena_size_ = arena_size;
    uv_timer_init(loop_, &timer_);
    uv_check_init(loop_, &check_);
    uv_idle_init(loop_, &idle_);
    timer_.data = check_.data = idle_.data = this;
    uv_unref(reinterpret_cast<uv_handle_t*>(&timer_));
    uv_unref(reinterpret_cast<uv_handle_t*>(&check_));
    handles_ = 3;
  }

  CoreHost* host() const { return host_; }

  void Configure(uint32_t connect_ms, uint32_t headers_ms, uint32_t body_ms, uint32_t per_endpoint) {
    connect_ms_ = connect_ms;
    headers_ms_ = headers_ms;
    body_ms_ = body_ms;
    per_endpoint_ = per_endpoint;
    uint32_t shortest = 0;
    for (uint32_t v : {connect_ms, headers_ms, body_ms})
      if (v > 0 && (shortest == 0 || v < shortest)) shortest = v;
    tick_ms_ = shortest == 0 ? 250 : std::max<uint32_t>(5, std::min<uint32_t>(250, shortest / 8));
  }

  uv_loop_t* loop() const { return loop_; }
  uint64_t Now() const { return uv_now(loop_); }

  // ---- calls ------------------------------------------------------------------------------

  Call* Lookup(int32_t id) {
    uint32_t slot = static_cast<uint32_t>(id) & kSlotMask;
    if (id < 0 || slot >= calls_.size()) return nullptr;
    Call* c = calls_[slot].get();
    return c->id == id ? c : nullptr;
  }

  void FreeCall(Call* c) {
    c->id = -1;
    c->conn = nullptr;
    c->pool = nullptr;
    c->paused = false;
    c->queued = false;
    if (c->out.capacity() > kShrinkAbove) std::string().swap(c->out);
    else c->out.clear();
  }

  bool AddPool(uint32_t id, const std::string& ip, uint32_t port) {
    if (id >= pools_.size()) pools_.resize(id + 1);
    auto p = std::make_unique<Pool>();
    if (ip.find(':') != std::string::npos) {
      if (uv_ip6_addr(ip.c_str(), static_cast<int>(port), reinterpret_cast<sockaddr_in6*>(&p->addr)) != 0) return false;
    } else if (uv_ip4_addr(ip.c_str(), static_cast<int>(port), reinterpret_cast<sockaddr_in*>(&p->addr)) != 0) {
      return false;
    }
    if (pools_[id]) {
      // re-registering an endpoint id (a new address, or after ClosePool): new connections use it
      pools_[id]->addr = p->addr;
      pools_[id]->closed = false;
      return true;
    }
    pools_[id] = std::move(p);
    return true;
  }

  Pool* GetPool(uint32_t id) { return id < pools_.size() ? pools_[id].get() : nullptr; }

  // The call a queue entry names, or nullptr if the entry is stale: its call was
  // aborted or has started, or (the JS side's generations wrapped) the id now
  // names a newer call, which may be waiting in another pool's queue.
  Call* Waiting(int32_t id, const Pool* pool) {
    Call* c = Lookup(id);
    return c != nullptr && c->queued && c->pool == pool ? c : nullptr;
  }

  // send: returns false (and does nothing) when the id's slot is in use.
  bool Send(int32_t id, Pool* pool, const char* hp, size_t hl, const uint8_t* bp, size_t bl) {
    uint32_t slot = static_cast<uint32_t>(id) & kSlotMask;
    if (slot >= calls_.size()) {
      size_t n = std::max<size_t>(slot + 1, calls_.size() * 2);
      n = std::min<size_t>(n, kSlotMask + 1);
      calls_.reserve(n);
      while (calls_.size() < n) calls_.push_back(std::make_unique<Call>());
    }
    Call* c = calls_[slot].get();
    if (c->id != -1) return false;
    c->id = id;
    c->pool = pool;
    if (closed_) {
      PushError(c, UV_ECANCELED, kRClientClosed, false);
      FreeCall(c);
      Schedule();
      return true;
    }
    Dispatch(c, hp, hl, bp, bl);
    Schedule();  // a synchronous failure left an event
    return true;
  }

  void Dispatch(Call* c, const char* hp, size_t hl, const uint8_t* bp, size_t bl) {
    Pool* pool = c->pool;
    while (!pool->idle.empty()) {
      Conn* k = pool->idle.back();
      pool->idle.pop_back();
      k->in_idle = false;
      if (!k->closing) {
        k->Start(c, hp, hl, bp, bl);
        return;
      }
    }
    if (pool->open < per_endpoint_) {
      NewConn(pool, c, hp, hl, bp, bl);
      return;
    }
    if (hp != nullptr) {
      c->out.assign(hp, hl);
      if (bl > 0) c->out.append(reinterpret_cast<const char*>(bp), bl);
    }
    c->queued = true;
    c->queued_at = Now();
    pool->queue.push_back(c->id);
  }

  // Fails queued calls that waited longer than the headers limit (oldest first:
  // a queue is in sending order, so the scan stops at the first one still in time).
  void ExpireQueued(uint64_t now) {
    if (headers_ms_ == 0) return;
    for (auto& p : pools_) {
      if (!p) continue;
      while (!p->queue.empty()) {
        Call* c = Waiting(p->queue.front(), p.get());
        if (c == nullptr) {
          p->queue.pop_front();
          continue;
        }
        if (now - c->queued_at <= static_cast<uint64_t>(headers_ms_) + tick_ms_) break;
        p->queue.pop_front();
        PushError(c, UV_ETIMEDOUT, kRQueueTimeout, false);
        FreeCall(c);
      }
    }
  }

  void NewConn(Pool* pool, Call* c, const char* hp, size_t hl, const uint8_t* bp, size_t bl) {
    // the loop's cached time is that of this turn's start, before whatever JavaScript ran
    // since: the connect limit counts from now (once per connection, not per request)
    uv_update_time(loop_);
    Conn* k = new Conn();
    k->core = this;
    k->pool = pool;
    uv_tcp_init(loop_, &k->tcp);
    handles_++;
    k->tcp.data = k;
    k->creq.data = k;
    k->wreq.data = k;
    uv_tcp_nodelay(&k->tcp, 1);
    Link(k);
    pool->open++;
    opened_++;
    if (!uv_is_active(reinterpret_cast<uv_handle_t*>(&timer_))) uv_timer_start(&timer_, &Core::OnTick, tick_ms_, tick_ms_);
    k->Start(c, hp, hl, bp, bl);
    int r = uv_tcp_connect(&k->creq, &k->tcp, reinterpret_cast<const sockaddr*>(&pool->addr), &Core::OnConnect);
    if (r < 0) k->Fail(r, kRConnect);
  }

  // A connection left the pool: a waiting call may open a new one.
  void Drain(Pool* pool) {
    if (draining_ || closed_) return;
    draining_ = true;
    while (!pool->queue.empty() && pool->open < per_endpoint_) {
      Call* c = Waiting(pool->queue.front(), pool);
      pool->queue.pop_front();
      if (c == nullptr) continue;
      NewConn(pool, c, nullptr, 0, nullptr, 0);
    }
    draining_ = false;
  }

  // A finished connection is handed to the next waiting call or parked.
  void Release(Conn* k) {
    Pool* pool = k->pool;
    while (!pool->queue.empty()) {
      Call* c = Waiting(pool->queue.front(), pool);
      pool->queue.pop_front();
      if (c == nullptr) continue;
      k->Start(c, nullptr, 0, nullptr, 0);
      return;
    }
    k->in_idle = true;
    k->SetReading(true);  // an idle connection still watches for the endpoint closing it
    uv_unref(reinterpret_cast<uv_handle_t*>(&k->tcp));
    pool->idle.push_back(k);
  }

  void Abort(int32_t id) {
    if (shutting_down_) return;  // every connection is closing and no call will see another event
    Call* c = Lookup(id);
    if (c == nullptr) return;
    Conn* k = c->conn;
    FreeCall(c);
    if (k != nullptr) {
      k->call = nullptr;
      k->Close();  // mid-request: the connection cannot be reused; the endpoint sees the disconnect
    }
    // a queued call leaves a stale id in the queue, skipped when reached
  }

  void Pause(int32_t id) {
    if (shutting_down_) return;
    Call* c = Lookup(id);
    if (c == nullptr || c->paused) return;
    c->paused = true;
    if (c->conn != nullptr) c->conn->SetReading(false);
  }

  void Resume(int32_t id) {
    if (shutting_down_) return;
    Call* c = Lookup(id);
    if (c == nullptr || !c->paused) return;
    c->paused = false;
    Conn* k = c->conn;
    if (k != nullptr) {
      k->active_at = Now();  // the pause was the client's doing: the body timeout starts afresh
      k->SetReading(true);
    }
  }

  // closePool(id): the endpoint left the router. Its waiting calls fail, its idle
  // connections close now, and each busy one closes when its call ends (never
  // parked again), so no descriptor stays open to an endpoint that is gone.
  void ClosePool(uint32_t id) {
    Pool* p = GetPool(id);
    if (p == nullptr || p->closed) return;
    p->closed = true;
    for (int32_t cid : p->queue) {
      Call* c = Waiting(cid, p);
      if (c == nullptr) continue;
      PushError(c, UV_ECANCELED, kRClientClosed, false);
      FreeCall(c);
    }
    p->queue.clear();
    std::vector<Conn*> idle;
    idle.swap(p->idle);
    for (Conn* k : idle) {
      k->in_idle = false;
      k->Close();
    }
    Schedule();
  }

  // close(): fails waiting calls, closes idle connections; busy ones finish.
  void CloseClient() {
    if (closed_) return;
    closed_ = true;
    for (auto& p : pools_) {
      if (!p) continue;
      for (int32_t id : p->queue) {
        Call* c = Waiting(id, p.get());
        if (c == nullptr) continue;
        PushError(c, UV_ECANCELED, kRClientClosed, false);
        FreeCall(c);
      }
      p->queue.clear();
      std::vector<Conn*> idle;
      idle.swap(p->idle);
      for (Conn* k : idle) {
        k->in_idle = false;
        k->Close();
      }
    }
    Schedule();
  }

  // ---- connections ------------------------------------------------------------------------

  void Link(Conn* k) {
    k->next = conns_;
    if (conns_ != nullptr) conns_->prev = k;
    conns_ = k;
  }
  void Unlink(Conn* k) {
    if (k->prev != nullptr) k->prev->next = k->next;
    else if (conns_ == k) conns_ = k->next;
    if (k->next != nullptr) k->next->prev = k->prev;
    k->prev = k->next = nullptr;
  }

  void HandleClosed() {
    handles_--;
    if (handles_ == 0 && shutting_down_) Finish();
  }

  // ---- events -----------------------------------------------------------------------------

  void Push(int32_t type, int32_t id, int32_t a, int32_t b, double f = 0, int32_t c = 0) {
    events_.push_back(Event{type, id, a, b, f, c, 0});
  }
  void PushError(Call* c, int err, int32_t reason, bool stale) { Push(kEvError, c->id, err, reason, 0, stale ? 1 : 0); }
  void PushData(Call* c, const char* p, size_t n) {
    Push(kEvData, c->id, static_cast<int32_t>(p - arena_), static_cast<int32_t>(n));
  }

  int32_t InternContentType(const char* p, size_t n) {
    if (n == 0) return -1;
    for (size_t i = 0; i < ct_table_.size(); i++) {
      const std::string& s = ct_table_[i];
      if (s.size() == n && memcmp(s.data(), p, n) == 0) return static_cast<int32_t>(i);
    }
    if (ct_table_.size() < kMaxInterned) {
      ct_table_.emplace_back(p, n);
      return static_cast<int32_t>(ct_table_.size() - 1);
    }
    ct_extra_.emplace_back(p, n);
    return static_cast<int32_t>(kMaxInterned + ct_extra_.size() - 1);
  }

  const std::string* ContentType(uint32_t i) const {
    if (i < ct_table_.size()) return &ct_table_[i];
    if (i >= kMaxInterned && i - kMaxInterned < ct_extra_.size()) return &ct_extra_[i - kMaxInterned];
    return nullptr;
  }

  char* ArenaTail(size_t* len) {
    *len = std::min(kReadSize, arena_size_ - arena_used_);
    return arena_ + arena_used_;
  }
  void ArenaTake(size_t n) { arena_used_ += n; }

  // After a libuv callback: deliver now if the arena runs low, otherwise by the end of this loop turn.
  void AfterIo() {
    if (arena_size_ - arena_used_ < kReadSize) Flush();
    else Schedule();
  }

  void Schedule() {
    if (events_.empty() || scheduled_ || flushing_ || shutting_down_) return;
    scheduled_ = true;
    uv_check_start(&check_, &Core::OnCheck);
    uv_idle_start(&idle_, &Core::OnIdle);  // keeps the poll phase from blocking until the check runs
  }

  void Flush() {
    if (flushing_ || shutting_down_) return;
    if (scheduled_) {
      scheduled_ = false;
      uv_check_stop(&check_);
      uv_idle_stop(&idle_);
    }
    if (events_.empty()) {
      arena_used_ = 0;
      return;
    }
    flushing_ = true;
    flushes_++;
    size_t done = 0;
    while (done < events_.size() && !shutting_down_) {
      size_t n = std::min(events_.size() - done, ev_cap_);
      memcpy(ev_ptr_, events_.data() + done, n * sizeof(Event));
      done += n;
      delivered_ += n;
      host_->DeliverEvents(n);
    }
    events_.clear();
    ct_extra_.clear();
    arena_used_ = 0;
    flushing_ = false;
    if (shutting_down_) host_->ReleaseShared();
  }

  // ---- lifetime -----------------------------------------------------------------------------

  // Closes every handle; the core frees itself when the last one has closed.
  void Shutdown() {
    if (shutting_down_) return;
    shutting_down_ = true;
    closed_ = true;
    while (conns_ != nullptr) {
      Conn* k = conns_;
      if (k->call != nullptr) k->call->conn = nullptr;  // no call keeps a pointer to a closing connection
      k->call = nullptr;
      k->Close();  // unlinks k
    }
    for (auto& p : pools_)
      if (p) {
        p->idle.clear();
        p->queue.clear();
      }
    uv_close(reinterpret_cast<uv_handle_t*>(&timer_), &Core::OnCoreHandleClosed);
    uv_close(reinterpret_cast<uv_handle_t*>(&check_), &Core::OnCoreHandleClosed);
    uv_close(reinterpret_cast<uv_handle_t*>(&idle_), &Core::OnCoreHandleClosed);
    if (flushing_) return;  // the flush in progress releases the shared buffers when it returns
    host_->ReleaseShared();
  }

  void Finish() {
    host_->CoreFinished();
    delete this;
  }

  static void OnCoreHandleClosed(uv_handle_t* h) { static_cast<Core*>(h->data)->HandleClosed(); }

  static void OnCheck(uv_check_t* h) { static_cast<Core*>(h->data)->Flush(); }
  static void OnIdle(uv_idle_t* h) {}

  static void OnTick(uv_timer_t* h) {
    Core* core = static_cast<Core*>(h->data);
    const uint64_t now = core->Now();
    // the queue first: a connection failing below would hand its place to a call
    // that is already out of time, which should fail as the queued call it is
    core->ExpireQueued(now);
    for (Conn* k = core->conns_; k != nullptr;) {
      Conn* next = k->next;
      k->Check(now, core->tick_ms_);
      k = next;
    }
    if (core->conns_ == nullptr) uv_timer_stop(&core->timer_);
    core->AfterIo();
  }

  static void OnConnect(uv_connect_t* req, int status);

  uv_loop_t* loop_;
  CoreHost* host_ = nullptr;
  Event* ev_ptr_ = nullptr;
  size_t ev_cap_ = 0;
  char* arena_ = nullptr;
  size_t arena_size_ = 0;
  size_t arena_used_ = 0;
  std::vector<Event> events_;
  std::vector<std::unique_ptr<Call>> calls_;
  std::vector<std::unique_ptr<Pool>> pools_;
  std::vector<std::string> ct_table_;
  std::vector<std::string> ct_extra_;
  Conn* conns_ = nullptr;
  uv_timer_t timer_;
  uv_check_t check_;
  uv_idle_t idle_;
  uint32_t handles_ = 0;
  uint32_t connect_ms_ = 2000, headers_ms_ = 300000, body_ms_ = 300000, per_endpoint_ = 256, tick_ms_ = 250;
  double flushes_ = 0, delivered_ = 0, opened_ = 0;
  bool closed_ = false;
  bool shutting_down_ = false;
  bool flushing_ = false;
  bool scheduled_ = false;
  bool draining_ = false;
};

void OnAlloc(uv_handle_t* h, size_t, uv_buf_t* buf);
void OnRead(uv_stream_t* s, ssize_t n, const uv_buf_t* buf);
void OnWrite(uv_write_t* req, int status);
void OnConnClosed(uv_handle_t* h);

}  // namespace upstream
}  // namespace switchyard
