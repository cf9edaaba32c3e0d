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
class Conn;

// One call slot: a request the JS side sent, waiting for a connection or on one.
struct Call {
  int32_t id = -1;  // -1: free
  Pool* pool = nullptr;
  Conn* conn = nullptr;
  std::string out;  // the request while it waits for a connection
  uint64_t queued_at = 0;  // loop time it joined its pool's queue (valid while queued)
  bool queued = false;
  bool paused = false;
};

// One endpoint: its address, idle connections and waiting calls.
struct Pool {
  sockaddr_storage addr{};
  uint32_t open = 0;
  bool closed = false;  // ClosePool: its endpoint is gone; connections close as their calls end
  uint32_t gen = 0;  // bumped when AddPool gives the pool a new address: older connections are never parked again
  std::vector<Conn*> idle;
  std::deque<int32_t> queue;  // waiting call ids (stale ids are skipped)
};

// One keep-alive TCP connection to an endpoint, carrying one call at a time.
class Conn {
 public:
  Conn(Core* core, Pool* pool);

  // The fields its core links, parks and walks.
  uv_tcp_t tcp;
  Core* const core;
  Pool* const pool;
  const uint32_t gen;  // the pool's address generation this connection was opened for
  Call* call = nullptr;
  Conn* prev = nullptr;
  Conn* next = nullptr;
  bool closing = false;
  bool in_idle = false;

  // Connects to addr (once, after the first Start); a negative libuv error if it could not begin.
  int Connect(const sockaddr* addr);
  // Carries call c: its request is [hp, hl) + [bp, bl), or (hp null) the bytes c->out holds.
  void Start(Call* c, const char* hp, size_t hl, const uint8_t* bp, size_t bl);
  void Close();
  // Fails its call (if any) with err/reason and closes.
  void Fail(int err, int32_t reason);
  // The timer's look: the phase limit passed (slack: the tick), or idle too long.
  void Check(uint64_t now, uint32_t slack);
  void SetReading(bool on);
  // The client resumed reading: the body timeout starts afresh.
  void Resume(uint64_t now);

  // The response parser's sink (h1_parser.h).
  void OnHead(const h1::Head& h);
  void OnBody(char* p, size_t n);

 private:
  static void OnConnect(uv_connect_t* req, int status);
  static void OnAlloc(uv_handle_t* h, size_t, uv_buf_t* buf);
  static void OnRead(uv_stream_t* s, ssize_t n, const uv_buf_t* buf);
  static void OnWrite(uv_write_t* req, int status);
  static void OnClosed(uv_handle_t* h);

  void WriteOut();
  void TryWrite(const char* hp, size_t hl, const uint8_t* bp, size_t bl);
  void OnBytes(char* p, size_t n);
  void Complete(bool extra_bytes);
  void OnEof();

  uv_connect_t creq;
  uv_write_t wreq;
  std::string out;  // request bytes the socket has not taken yet (owned until the write completes)
  size_t out_off = 0;
  h1::ResponseParser parser;
  uint64_t active_at = 0;
  uint64_t waited = 0;  // how long the current call waited in the queue (ms; counts toward its headers limit)
  uint32_t limit_ms = 0;
  bool connected = false;
  bool reused = false;
  bool got_bytes = false;
  bool writing = false;
  bool reading = false;
};

// The client: call slots, pools, connections, the timer and the event queue to the host.
class Core {
 public:
  explicit Core(uv_loop_t* loop) : loop_(loop) {}

  // ---- the host's side (upstream_client.cc) -------------------------------------------------

  // events: the shared event buffer (cap records); arena: the shared read arena.
  // Both stay valid until the host's ReleaseShared(). The core frees itself after
  // the last handle closed (Shutdown), telling the host with CoreFinished().
  void Init(CoreHost* host, Event* events, size_t cap, char* arena, size_t arena_size);
  CoreHost* host() const { return host_; }
  void Configure(uint32_t connect_ms, uint32_t headers_ms, uint32_t body_ms, uint32_t per_endpoint);
  bool AddPool(uint32_t id, const std::string& ip, uint32_t port);
  Pool* GetPool(uint32_t id) { return id < pools_.size() ? pools_[id].get() : nullptr; }
  // send: returns false (and does nothing) when the id's slot is in use.
  bool Send(int32_t id, Pool* pool, const char* hp, size_t hl, const uint8_t* bp, size_t bl);
  void Abort(int32_t id);
  void Pause(int32_t id);
  void Resume(int32_t id);
  // closePool(id): the endpoint left the router. Its waiting calls fail, its idle
  // connections close now, and each busy one closes when its call ends (never
  // parked again), so no descriptor stays open to an endpoint that is gone.
  void ClosePool(uint32_t id);
  // close(): fails waiting calls, closes idle connections; busy ones finish.
  void CloseClient();
  const std::string* ContentType(uint32_t i) const;
  // Closes every handle; the core frees itself when the last one has closed.
  void Shutdown();
  bool shutting_down() const { return shutting_down_; }
  // Counters: deliveries to JS, event records delivered, connections opened; connections open now.
  double flushes() const { return flushes_; }
  double delivered() const { return delivered_; }
  double opened() const { return opened_; }
  double OpenConnections() const;

  // ---- the connections' side (Conn) ---------------------------------------------------------

  uv_loop_t* loop() const { return loop_; }
  uint64_t Now() const { return uv_now(loop_); }
  uint32_t connect_ms() const { return connect_ms_; }
  uint32_t headers_ms() const { return headers_ms_; }
  uint32_t body_ms() const { return body_ms_; }
  bool closed() const { return closed_; }
  void FreeCall(Call* c);
  // A connection left the pool: a waiting call may open a new one.
  void Drain(Pool* pool);
  // A finished connection is handed to the next waiting call or parked.
  void Release(Conn* k);
  void Unlink(Conn* k);
  void HandleClosed();
  void Push(int32_t type, int32_t id, int32_t a, int32_t b, double f = 0, int32_t c = 0) {
    events_.push_back(Event{type, id, a, b, f, c, 0});
  }
  void PushError(Call* c, int err, int32_t reason, bool stale) { Push(kEvError, c->id, err, reason, 0, stale ? 1 : 0); }
  void PushData(Call* c, const char* p, size_t n) {
    Push(kEvData, c->id, static_cast<int32_t>(p - arena_), static_cast<int32_t>(n));
  }
  int32_t InternContentType(const char* p, size_t n);
  char* ArenaTail(size_t* len) {
    *len = std::min(kReadSize, arena_size_ - arena_used_);
    return arena_ + arena_used_;
  }
  void ArenaTake(size_t n) { arena_used_ += n; }
  // After a libuv callback: deliver now if the arena runs low, otherwise by the end of this loop turn.
  void AfterIo();

 private:
  Call* Lookup(int32_t id);
  // The call a queue entry names, or nullptr if the entry is stale: its call was
  // aborted or has started, or (the JS side's generations wrapped) the id now
  // names a newer call, which may be waiting in another pool's queue.
  Call* Waiting(int32_t id, const Pool* pool);
  void Dispatch(Call* c, const char* hp, size_t hl, const uint8_t* bp, size_t bl);
  // Fails queued calls that waited longer than the headers limit (oldest first:
  // a queue is in sending order, so the scan stops at the first one still in time).
  void ExpireQueued(uint64_t now);
  void NewConn(Pool* pool, Call* c, const char* hp, size_t hl, const uint8_t* bp, size_t bl);
  // A pool's waiting calls fail (the client or the endpoint closed); its idle connections close.
  void CancelWaitingAndIdle(Pool* p);
  void Link(Conn* k);
  void Schedule();
  void Flush();
  void Finish();

  static void OnCoreHandleClosed(uv_handle_t* h);
  static void OnCheck(uv_check_t* h);
  static void OnIdle(uv_idle_t* h);
  static void OnTick(uv_timer_t* h);

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

}  // namespace upstream
}  // namespace switchyard
