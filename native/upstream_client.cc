// The native HTTP/1.1 upstream client: keep-alive TCP connections per
// endpoint on the host's libuv loop, one request at a time per connection,
// a small response parser, and events delivered to JavaScript in batches.
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
#include "upstream_client.h"

#include <uv.h>

#include "h1_parser.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <vector>

namespace switchyard {
namespace {

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

void ThrowType(Napi::Env env, const char* msg) { Napi::TypeError::New(env, msg).ThrowAsJavaScriptException(); }
void ThrowRange(Napi::Env env, const char* msg) { Napi::RangeError::New(env, msg).ThrowAsJavaScriptException(); }

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

class UpstreamClientWrap;

class Core {
 public:
  Core(napi_env env, uv_loop_t* loop) : env_(env), loop_(loop) {}

  bool Init(Napi::Env env, Napi::Function cb, Napi::TypedArray events, Napi::Uint8Array arena) {
    cb_ = Napi::Persistent(cb);
    events_ref_ = Napi::Persistent(events.As<Napi::Object>());
    arena_ref_ = Napi::Persistent(arena.As<Napi::Object>());
    ev_ptr_ = reinterpret_cast<Event*>(static_cast<uint8_t*>(events.ArrayBuffer().Data()) + events.ByteOffset());
    ev_cap_ = events.ByteLength() / sizeof(Event);
    arena_ = reinterpret_cast<char*>(arena.Data());
    arena_size_ = arena.ByteLength();
    napi_value name;
    napi_create_string_utf8(env_, "SwitchyardUpstream", NAPI_AUTO_LENGTH, &name);
    if (napi_async_init(env_, Napi::Object::New(env), name, &async_) != napi_ok) return false;
    uv_timer_init(loop_, &timer_);
    uv_check_init(loop_, &check_);
    uv_idle_init(loop_, &idle_);
    timer_.data = check_.data = idle_.data = this;
    uv_unref(reinterpret_cast<uv_handle_t*>(&timer_));
    uv_unref(reinterpret_cast<uv_handle_t*>(&check_));
    handles_ = 3;
    napi_add_async_cleanup_hook(env_, &Core::OnEnvCleanup, this, &cleanup_);
    return true;
  }

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
      // re-registering an endpoint id (a new address): new connections use it
      pools_[id]->addr = p->addr;
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

  // send: returns false (with a JS exception set) on bad arguments.
  bool Send(Napi::Env env, int32_t id, Pool* pool, const char* hp, size_t hl, const uint8_t* bp, size_t bl) {
    uint32_t slot = static_cast<uint32_t>(id) & kSlotMask;
    if (slot >= calls_.size()) {
      size_t n = std::max<size_t>(slot + 1, calls_.size() * 2);
      n = std::min<size_t>(n, kSlotMask + 1);
      calls_.reserve(n);
      while (calls_.size() < n) calls_.push_back(std::make_unique<Call>());
    }
    Call* c = calls_[slot].get();
    if (c->id != -1) {
      ThrowRange(env, "call slot is in use");
      return false;
    }
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
    Napi::Env env(env_);
    Napi::HandleScope scope(env);
    napi_value fn = cb_.Value();
    napi_value recv;  // napi_make_callback wants an object receiver
    napi_get_global(env_, &recv);
    size_t done = 0;
    while (done < events_.size() && !shutting_down_) {
      size_t n = std::min(events_.size() - done, ev_cap_);
      memcpy(ev_ptr_, events_.data() + done, n * sizeof(Event));
      done += n;
      delivered_ += n;
      napi_value argv[1];
      napi_create_uint32(env_, static_cast<uint32_t>(n), &argv[0]);
      napi_value result;
      napi_status s = napi_make_callback(env_, async_, recv, fn, 1, argv, &result);
      if (s == napi_pending_exception) {
        napi_value err;
        napi_get_and_clear_last_exception(env_, &err);
        napi_fatal_exception(env_, err);
      }
    }
    events_.clear();
    ct_extra_.clear();
    arena_used_ = 0;
    flushing_ = false;
    if (shutting_down_) ReleaseJs();
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
    if (flushing_) return;  // the flush in progress releases the JS references when it returns
    ReleaseJs();
  }

  void ReleaseJs() {
    if (!env_gone_) {
      cb_.Reset();
      events_ref_.Reset();
      arena_ref_.Reset();
      if (async_ != nullptr) napi_async_destroy(env_, async_);
      async_ = nullptr;
    }
  }

  void Finish() {
    if (cleanup_ != nullptr) napi_remove_async_cleanup_hook(cleanup_);
    cleanup_ = nullptr;
    if (wrap_gone_callback_) wrap_gone_callback_(wrap_);
    delete this;
  }

  static void OnEnvCleanup(napi_async_cleanup_hook_handle handle, void* arg) {
    Core* core = static_cast<Core*>(arg);
    core->in_env_cleanup_ = true;
    core->Shutdown();
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

  napi_env env_;
  uv_loop_t* loop_;
  Napi::FunctionReference cb_;
  Napi::ObjectReference events_ref_;
  Napi::ObjectReference arena_ref_;
  napi_async_context async_ = nullptr;
  napi_async_cleanup_hook_handle cleanup_ = nullptr;
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
  bool env_gone_ = false;
  bool in_env_cleanup_ = false;
  void* wrap_ = nullptr;
  void (*wrap_gone_callback_)(void*) = nullptr;
};

// ---- connection -------------------------------------------------------------------------------

void OnAlloc(uv_handle_t* h, size_t, uv_buf_t* buf) {
  Conn* k = static_cast<Conn*>(h->data);
  size_t len;
  buf->base = k->core->ArenaTail(&len);
  buf->len = len;
}

void OnRead(uv_stream_t* s, ssize_t n, const uv_buf_t* buf) {
  Conn* k = static_cast<Conn*>(s->data);
  Core* core = k->core;
  if (n > 0) {
    core->ArenaTake(static_cast<size_t>(n));
    k->OnBytes(buf->base, static_cast<size_t>(n));
  } else if (n == UV_EOF) {
    k->OnEof();
  } else if (n < 0) {
    k->Fail(static_cast<int>(n), kRIo);
  }
  core->AfterIo();
}

void OnWrite(uv_write_t* req, int status) {
  Conn* k = static_cast<Conn*>(req->data);
  k->writing = false;
  if (k->closing || status == UV_ECANCELED) return;
  if (status < 0) {
    k->Fail(status, kRIo);
    k->core->AfterIo();
    return;
  }
  if (k->out.capacity() > kShrinkAbove) std::string().swap(k->out);
  else k->out.clear();
  k->out_off = 0;
}

void OnConnClosed(uv_handle_t* h) {
  Conn* k = static_cast<Conn*>(h->data);
  Core* core = k->core;
  delete k;
  core->HandleClosed();
}

void Core::OnConnect(uv_connect_t* req, int status) {
  Conn* k = static_cast<Conn*>(req->data);
  Core* core = k->core;
  if (k->closing || status == UV_ECANCELED) return;
  if (status < 0) {
    k->Fail(status, kRConnect);
  } else {
    k->connected = true;
    k->active_at = core->Now() - k->waited;  // a queued call's wait counts toward its headers limit
    k->limit_ms = core->headers_ms_;
    k->SetReading(k->call == nullptr || !k->call->paused);
    if (k->out.size() > k->out_off) k->WriteOut();
  }
  core->AfterIo();
}

void Conn::SetReading(bool on) {
  if (closing || !connected || on == reading) return;
  reading = on;
  if (on) uv_read_start(reinterpret_cast<uv_stream_t*>(&tcp), OnAlloc, OnRead);
  else uv_read_stop(reinterpret_cast<uv_stream_t*>(&tcp));
}

void Conn::Start(Call* c, const char* hp, size_t hl, const uint8_t* bp, size_t bl) {
  call = c;
  c->conn = this;
  got_bytes = false;
  parser.Start();
  const uint64_t now = core->Now();
  waited = c->queued ? now - c->queued_at : 0;
  c->queued = false;
  // the connect phase has its own limit; the headers phase counts a queued call's wait
  active_at = connected ? now - waited : now;
  limit_ms = connected ? core->headers_ms_ : core->connect_ms_;
  uv_ref(reinterpret_cast<uv_handle_t*>(&tcp));
  SetReading(!c->paused);
  if (hp != nullptr) {
    if (connected) {
      TryWrite(hp, hl, bp, bl);
    } else {
      out.assign(hp, hl);
      if (bl > 0) out.append(reinterpret_cast<const char*>(bp), bl);
      out_off = 0;
    }
  } else {
    out.swap(c->out);
    c->out.clear();
    out_off = 0;
    if (connected) WriteOut();
  }
}

// First attempt straight from the caller's memory; only what the socket does not take is copied.
void Conn::TryWrite(const char* hp, size_t hl, const uint8_t* bp, size_t bl) {
  uv_buf_t bufs[2] = {uv_buf_init(const_cast<char*>(hp), static_cast<unsigned>(hl)),
                      uv_buf_init(reinterpret_cast<char*>(const_cast<uint8_t*>(bp)), static_cast<unsigned>(bl))};
  int r = uv_try_write(reinterpret_cast<uv_stream_t*>(&tcp), bufs, bl > 0 ? 2 : 1);
  if (r == UV_EAGAIN) r = 0;
  if (r < 0) {
    Fail(r, kRIo);
    return;
  }
  size_t w = static_cast<size_t>(r);
  if (w == hl + bl) return;
  out.clear();
  out_off = 0;
  if (w < hl) {
    out.append(hp + w, hl - w);
    if (bl > 0) out.append(reinterpret_cast<const char*>(bp), bl);
  } else {
    out.append(reinterpret_cast<const char*>(bp) + (w - hl), bl - (w - hl));
  }
  WriteOut();
}

void Conn::WriteOut() {
  if (writing || closing) return;
  size_t len = out.size() - out_off;
  if (len == 0) return;
  uv_buf_t b = uv_buf_init(out.data() + out_off, static_cast<unsigned>(len));
  int r = uv_try_write(reinterpret_cast<uv_stream_t*>(&tcp), &b, 1);
  if (r == UV_EAGAIN) r = 0;
  if (r < 0) {
    Fail(r, kRIo);
    return;
  }
  out_off += static_cast<size_t>(r);
  if (out_off == out.size()) {
    out.clear();
    out_off = 0;
    return;
  }
  b = uv_buf_init(out.data() + out_off, static_cast<unsigned>(out.size() - out_off));
  r = uv_write(&wreq, reinterpret_cast<uv_stream_t*>(&tcp), &b, 1, OnWrite);
  if (r < 0) {
    Fail(r, kRIo);
    return;
  }
  writing = true;
}

void Conn::Check(uint64_t now, uint32_t slack) {
  if (closing) return;
  if (call == nullptr) {
    if (now - active_at > kIdleKeepAliveMs) Close();
    return;
  }
  if (limit_ms == 0 || call->paused) return;
  if (now - active_at <= static_cast<uint64_t>(limit_ms) + slack) return;
  Fail(UV_ETIMEDOUT, connected ? kRTimeout : kRConnectTimeout);
}

void Conn::OnEof() {
  if (call != nullptr && parser.Eof()) {
    Complete(false);
    return;
  }
  Fail(UV_ECONNRESET, kRClosed);
}

void Conn::Fail(int err, int32_t reason) {
  if (closing) return;
  Call* c = call;
  const bool stale = reused && !got_bytes && err != UV_ETIMEDOUT;
  call = nullptr;
  Close();
  if (c == nullptr) return;
  core->PushError(c, err, reason, stale);
  core->FreeCall(c);
}

void Conn::Close() {
  if (closing) return;
  closing = true;
  if (in_idle) {
    auto& idle = pool->idle;
    idle.erase(std::remove(idle.begin(), idle.end(), this), idle.end());
    in_idle = false;
  }
  if (call != nullptr) {
    call->conn = nullptr;
    call = nullptr;
  }
  core->Unlink(this);
  pool->open--;
  uv_close(reinterpret_cast<uv_handle_t*>(&tcp), OnConnClosed);
  core->Drain(pool);
}

void Conn::Complete(bool extra_bytes) {
  Call* c = call;
  call = nullptr;
  core->Push(kEvEnd, c->id, 0, 0);
  const bool was_paused = c->paused;
  c->conn = nullptr;
  core->FreeCall(c);
  if (!parser.keep_alive() || writing || extra_bytes || out.size() > out_off || core->closed_) {
    Close();
    return;
  }
  (void)was_paused;
  reused = true;
  active_at = core->Now();
  core->Release(this);
}

void Conn::OnHead(const h1::Head& h) {
  limit_ms = core->body_ms_;
  active_at = core->Now();  // the body phase starts
  core->Push(kEvHead, call->id, h.status, core->InternContentType(h.type, h.type_len), h.length);
}

void Conn::core_push_data(char* p, size_t n) { core->PushData(call, p, n); }

void Conn::OnBytes(char* p, size_t n) {
  if (call == nullptr) {
    Close();  // bytes on an idle connection: not ours; drop the connection
    return;
  }
  got_bytes = true;
  // the head must be complete within the headers limit (bytes of it do not restart it,
  // or an engine trickling a head could hold the call forever); body bytes are progress
  if (!parser.in_head()) active_at = core->Now();
  switch (parser.Feed(p, n, *this)) {
    case h1::Result::More:
      return;
    case h1::Result::Done:
      Complete(parser.consumed() < n);
      return;
    case h1::Result::Fail:
      Fail(UV_EPROTO, static_cast<int32_t>(parser.error()));
      return;
  }
}

// ---- the JS class -----------------------------------------------------------------------------

class UpstreamClientWrap : public Napi::ObjectWrap<UpstreamClientWrap> {
 public:
  static Napi::Function Define(Napi::Env env) {
    return DefineClass(env, "UpstreamClient",
                       {
                           InstanceMethod<&UpstreamClientWrap::AddPool>("addPool"),
                           InstanceMethod<&UpstreamClientWrap::Send>("send"),
                           InstanceMethod<&UpstreamClientWrap::Abort>("abort"),
                           InstanceMethod<&UpstreamClientWrap::Pause>("pause"),
                           InstanceMethod<&UpstreamClientWrap::Resume>("resume"),
                           InstanceMethod<&UpstreamClientWrap::Close>("close"),
                           InstanceMethod<&UpstreamClientWrap::Destroy>("destroy"),
                           InstanceMethod<&UpstreamClientWrap::ContentType>("contentType"),
                           InstanceMethod<&UpstreamClientWrap::Stats>("stats"),
                       });
  }

  // new UpstreamClient(onEvents, events: Int32Array, arena: Uint8Array,
  //                    connectTimeoutMs, headersTimeoutMs, bodyTimeoutMs, connectionsPerEndpoint)
  explicit UpstreamClientWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<UpstreamClientWrap>(info) {
    Napi::Env env = info.Env();
    if (info.Length() < 7 || !info[0].IsFunction()) { ThrowType(env, "onEvents must be a function"); return; }
    if (!info[1].IsTypedArray() || info[1].As<Napi::TypedArray>().TypedArrayType() != napi_int32_array)
      { ThrowType(env, "events must be an Int32Array"); return; }
    if (!info[2].IsTypedArray() || info[2].As<Napi::TypedArray>().TypedArrayType() != napi_uint8_array)
      { ThrowType(env, "arena must be a Uint8Array"); return; }
    Napi::TypedArray events = info[1].As<Napi::TypedArray>();
    Napi::Uint8Array arena = info[2].As<Napi::Uint8Array>();
    if (events.ByteLength() < sizeof(Event) * 16 || events.ByteOffset() % 8 != 0)
      { ThrowRange(env, "events must hold at least 16 records (128 int32s) and be 8-byte aligned"); return; }
    if (arena.ByteLength() < kMinArena || arena.ByteLength() > (1u << 30))
      { ThrowRange(env, "arena must be between 256 KiB and 1 GiB"); return; }
    uint32_t ms[4];
    for (int i = 0; i < 4; i++) {
      if (!info[3 + i].IsNumber()) { ThrowType(env, "timeouts and connectionsPerEndpoint must be numbers"); return; }
      double v = info[3 + i].As<Napi::Number>().DoubleValue();
      if (!(v >= 0 && v <= 86400000) || v != static_cast<double>(static_cast<uint32_t>(v)))
        { ThrowRange(env, "timeouts must be integers in [0, 86400000] ms"); return; }
      ms[i] = static_cast<uint32_t>(v);
    }
    if (ms[3] < 1 || ms[3] > 65536) { ThrowRange(env, "connectionsPerEndpoint must be in [1, 65536]"); return; }
    uv_loop_t* loop = nullptr;
    if (napi_get_uv_event_loop(env, &loop) != napi_ok || loop == nullptr)
      { Napi::Error::New(env, "no event loop").ThrowAsJavaScriptException(); return; }
    core_ = new Core(env, loop);
    if (!core_->Init(env, info[0].As<Napi::Function>(), events, arena)) {
      delete core_;
      core_ = nullptr;
      { Napi::Error::New(env, "cannot create the async context").ThrowAsJavaScriptException(); return; }
    }
    core_->Configure(ms[0], ms[1], ms[2], ms[3]);
    core_->wrap_ = this;
    core_->wrap_gone_callback_ = &UpstreamClientWrap::CoreGone;
  }

  ~UpstreamClientWrap() override {
    if (core_ != nullptr) {
      core_->wrap_gone_callback_ = nullptr;
      core_->wrap_ = nullptr;
      core_->Shutdown();
      core_ = nullptr;
    }
  }

 private:
  static void CoreGone(void* self) { static_cast<UpstreamClientWrap*>(self)->core_ = nullptr; }

  bool Ready(const Napi::CallbackInfo& info) {
    if (core_ == nullptr || core_->shutting_down_) {
      Napi::Error::New(info.Env(), "the upstream client is shut down").ThrowAsJavaScriptException();
      return false;
    }
    return true;
  }

  static bool GetId(const Napi::CallbackInfo& info, size_t i, int32_t* out) {
    if (!info[i].IsNumber()) {
      ThrowType(info.Env(), "call id must be a number");
      return false;
    }
    int32_t v = info[i].As<Napi::Number>().Int32Value();
    if (v < 0) {
      ThrowRange(info.Env(), "call id must be a non-negative int32");
      return false;
    }
    *out = v;
    return true;
  }

  // addPool(poolId, ip, port)
  void AddPool(const Napi::CallbackInfo& info) {
    if (!Ready(info)) return;
    Napi::Env env = info.Env();
    if (!info[0].IsNumber() || !info[1].IsString() || !info[2].IsNumber())
      return ThrowType(env, "addPool(poolId: number, ip: string, port: number)");
    double id = info[0].As<Napi::Number>().DoubleValue();
    double port = info[2].As<Napi::Number>().DoubleValue();
    if (!(id >= 0 && id < 1 << 20) || id != static_cast<double>(static_cast<uint32_t>(id)))
      return ThrowRange(env, "poolId must be an integer in [0, 2^20)");
    if (!(port >= 1 && port <= 65535) || port != static_cast<double>(static_cast<uint32_t>(port)))
      return ThrowRange(env, "port must be an integer in [1, 65535]");
    std::string ip = info[1].As<Napi::String>().Utf8Value();
    if (!core_->AddPool(static_cast<uint32_t>(id), ip, static_cast<uint32_t>(port)))
      return ThrowType(env, "ip must be an IPv4 or IPv6 address literal");
  }

  // send(id, poolId, head: string (latin1), body: Uint8Array | null)
  // On the hot path: four N-API calls after the wrapper's own two (each value is
  // read with the call that also checks its type; the head string goes straight
  // into a buffer kept between calls).
  void Send(const Napi::CallbackInfo& info) {
    if (!Ready(info)) return;
    Napi::Env env = info.Env();
    int32_t id;
    if (napi_get_value_int32(env, info[0], &id) != napi_ok) return ThrowType(env, "call id must be a number");
    if (id < 0) return ThrowRange(env, "call id must be a non-negative int32");
    uint32_t pool_id;
    if (napi_get_value_uint32(env, info[1], &pool_id) != napi_ok) return ThrowType(env, "poolId must be a number");
    Pool* pool = core_->GetPool(pool_id);
    if (pool == nullptr) return ThrowRange(env, "unknown poolId (addPool first)");
    if (head_.size() < kHeadBuf) head_.resize(kHeadBuf);
    size_t hl = 0;
    if (napi_get_value_string_latin1(env, info[2], head_.data(), head_.size(), &hl) != napi_ok)
      return ThrowType(env, "head must be a string");
    if (hl + 1 >= head_.size()) {
      // it may not have fitted: ask for the length, then copy it whole
      if (napi_get_value_string_latin1(env, info[2], nullptr, 0, &hl) != napi_ok) return ThrowType(env, "head must be a string");
      head_.resize(hl + 1);
      napi_get_value_string_latin1(env, info[2], head_.data(), hl + 1, &hl);
    }
    if (hl == 0) return ThrowRange(env, "head must not be empty");
    const uint8_t* bp = nullptr;
    size_t bl = 0;
    napi_typedarray_type type;
    void* data = nullptr;
    if (napi_get_typedarray_info(env, info[3], &type, &bl, &data, nullptr, nullptr) == napi_ok) {
      if (type != napi_uint8_array) return ThrowType(env, "body must be a Uint8Array or null");
      bp = static_cast<const uint8_t*>(data);
    } else {
      napi_valuetype vt;
      if (napi_typeof(env, info[3], &vt) != napi_ok || (vt != napi_null && vt != napi_undefined))
        return ThrowType(env, "body must be a Uint8Array or null");
      bl = 0;
    }
    if (bl > 0xffffffffu - hl) return ThrowRange(env, "request too large");
    core_->Send(env, id, pool, head_.data(), hl, bp, bl);
  }

  void Abort(const Napi::CallbackInfo& info) {
    int32_t id;
    if (core_ == nullptr || !GetId(info, 0, &id)) return;
    core_->Abort(id);
  }
  void Pause(const Napi::CallbackInfo& info) {
    int32_t id;
    if (core_ == nullptr || !GetId(info, 0, &id)) return;
    core_->Pause(id);
  }
  void Resume(const Napi::CallbackInfo& info) {
    int32_t id;
    if (core_ == nullptr || !GetId(info, 0, &id)) return;
    core_->Resume(id);
  }
  void Close(const Napi::CallbackInfo& info) {
    if (core_ != nullptr) core_->CloseClient();
  }

  // destroy(): closes every connection now (no events follow) and frees the native state.
  void Destroy(const Napi::CallbackInfo& info) {
    if (core_ != nullptr) core_->Shutdown();
  }

  // contentType(index) -> string: the content type an event named by index.
  Napi::Value ContentType(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (core_ == nullptr || !info[0].IsNumber()) return Napi::String::New(env, "");
    const std::string* s = core_->ContentType(info[0].As<Napi::Number>().Uint32Value());
    if (s == nullptr) return Napi::String::New(env, "");
    napi_value v;
    napi_create_string_latin1(env, s->data(), s->size(), &v);
    return Napi::Value(env, v);
  }

  // stats() -> [flushes, events delivered, connections opened, open connections]
  Napi::Value Stats(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Napi::Array a = Napi::Array::New(env, 4);
    double open = 0;
    if (core_ != nullptr)
      for (Conn* k = core_->conns_; k != nullptr; k = k->next) open++;
    a.Set(0u, Napi::Number::New(env, core_ ? core_->flushes_ : 0));
    a.Set(1u, Napi::Number::New(env, core_ ? core_->delivered_ : 0));
    a.Set(2u, Napi::Number::New(env, core_ ? core_->opened_ : 0));
    a.Set(3u, Napi::Number::New(env, open));
    return a;
  }

  static constexpr size_t kHeadBuf = 4096;
  Core* core_ = nullptr;
  std::vector<char> head_;
};

}  // namespace

void InitUpstreamClient(Napi::Env env, Napi::Object exports) {
  exports.Set("UpstreamClient", UpstreamClientWrap::Define(env));
}

}  // namespace switchyard
