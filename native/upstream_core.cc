// The native upstream client's core (upstream_core.h): the call slots, pools,
// timer and event queue of Core, and the connections (Conn): libuv callbacks,
// request writes, timeouts, and the glue to the response parser.
#include "upstream_core.h"

namespace switchyard {
namespace upstream {

// ---- core -------------------------------------------------------------------------------------

void Core::Init(CoreHost* host, Event* events, size_t cap, char* arena, size_t arena_size) {
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

void Core::Configure(uint32_t connect_ms, uint32_t headers_ms, uint32_t body_ms, uint32_t per_endpoint) {
  connect_ms_ = connect_ms;
  headers_ms_ = headers_ms;
  body_ms_ = body_ms;
  per_endpoint_ = per_endpoint;
  uint32_t shortest = 0;
  for (uint32_t v : {connect_ms, headers_ms, body_ms})
    if (v > 0 && (shortest == 0 || v < shortest)) shortest = v;
  tick_ms_ = shortest == 0 ? 250 : std::max<uint32_t>(5, std::min<uint32_t>(250, shortest / 8));
}

Call* Core::Lookup(int32_t id) {
  uint32_t slot = static_cast<uint32_t>(id) & kSlotMask;
  if (id < 0 || slot >= calls_.size()) return nullptr;
  Call* c = calls_[slot].get();
  return c->id == id ? c : nullptr;
}

void Core::FreeCall(Call* c) {
  c->id = -1;
  c->conn = nullptr;
  c->pool = nullptr;
  c->paused = false;
  c->queued = false;
  if (c->out.capacity() > kShrinkAbove) std::string().swap(c->out);
  else c->out.clear();
}

bool Core::AddPool(uint32_t id, const std::string& ip, uint32_t port) {
  if (id >= pools_.size()) pools_.resize(id + 1);
  auto p = std::make_unique<Pool>();
  if (ip.find(':') != std::string::npos) {
    if (uv_ip6_addr(ip.c_str(), static_cast<int>(port), reinterpret_cast<sockaddr_in6*>(&p->addr)) != 0) return false;
  } else if (uv_ip4_addr(ip.c_str(), static_cast<int>(port), reinterpret_cast<sockaddr_in*>(&p->addr)) != 0) {
    return false;
  }
  if (pools_[id]) {
    // re-registering an endpoint id (a new address, or after ClosePool): new connections use it;
    // on a new address (the endpoint's DNS name moved) idle connections to the old one close now and
    // busy ones when their call ends, so nothing is sent to the old address once the call ends
    Pool* q = pools_[id].get();
    const bool moved = std::memcmp(&q->addr, &p->addr, sizeof(p->addr)) != 0;
    q->addr = p->addr;
    q->closed = false;
    if (moved) {
      q->gen++;
      std::vector<Conn*> idle;
      idle.swap(q->idle);
      for (Conn* k : idle) {
        k->in_idle = false;
        k->Close();
      }
      Schedule();
    }
    return true;
  }
  pools_[id] = std::move(p);
  return true;
}

Call* Core::Waiting(int32_t id, const Pool* pool) {
  Call* c = Lookup(id);
  return c != nullptr && c->queued && c->pool == pool ? c : nullptr;
}

bool Core::Send(int32_t id, Pool* pool, const char* hp, size_t hl, const uint8_t* bp, size_t bl) {
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

void Core::Dispatch(Call* c, const char* hp, size_t hl, const uint8_t* bp, size_t bl) {
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

void Core::ExpireQueued(uint64_t now) {
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

void Core::NewConn(Pool* pool, Call* c, const char* hp, size_t hl, const uint8_t* bp, size_t bl) {
  // the loop's cached time is that of this turn's start, before whatever JavaScript ran
  // since: the connect limit counts from now (once per connection, not per request)
  uv_update_time(loop_);
  Conn* k = new Conn(this, pool);
  handles_++;
  Link(k);
  pool->open++;
  opened_++;
  if (!uv_is_active(reinterpret_cast<uv_handle_t*>(&timer_))) uv_timer_start(&timer_, &Core::OnTick, tick_ms_, tick_ms_);
  k->Start(c, hp, hl, bp, bl);
  int r = k->Connect(reinterpret_cast<const sockaddr*>(&pool->addr));
  if (r < 0) k->Fail(r, kRConnect);
}

void Core::Drain(Pool* pool) {
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

void Core::Release(Conn* k) {
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

void Core::Abort(int32_t id) {
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

void Core::Pause(int32_t id) {
  if (shutting_down_) return;
  Call* c = Lookup(id);
  if (c == nullptr || c->paused) return;
  c->paused = true;
  if (c->conn != nullptr) c->conn->SetReading(false);
}

void Core::Resume(int32_t id) {
  if (shutting_down_) return;
  Call* c = Lookup(id);
  if (c == nullptr || !c->paused) return;
  c->paused = false;
  Conn* k = c->conn;
  if (k != nullptr) k->Resume(Now());  // the pause was the client's doing: the body timeout starts afresh
}

void Core::ClosePool(uint32_t id) {
  Pool* p = GetPool(id);
  if (p == nullptr || p->closed) return;
  p->closed = true;
  CancelWaitingAndIdle(p);
  Schedule();
}

void Core::CloseClient() {
  if (closed_) return;
  closed_ = true;
  for (auto& p : pools_)
    if (p) CancelWaitingAndIdle(p.get());
  Schedule();
}

void Core::CancelWaitingAndIdle(Pool* p) {
  for (int32_t id : p->queue) {
    Call* c = Waiting(id, p);
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

void Core::Link(Conn* k) {
  k->next = conns_;
  if (conns_ != nullptr) conns_->prev = k;
  conns_ = k;
}

void Core::Unlink(Conn* k) {
  if (k->prev != nullptr) k->prev->next = k->next;
  else if (conns_ == k) conns_ = k->next;
  if (k->next != nullptr) k->next->prev = k->prev;
  k->prev = k->next = nullptr;
}

void Core::HandleClosed() {
  handles_--;
  if (handles_ == 0 && shutting_down_) Finish();
}

int32_t Core::InternContentType(const char* p, size_t n) {
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

const std::string* Core::ContentType(uint32_t i) const {
  if (i < ct_table_.size()) return &ct_table_[i];
  if (i >= kMaxInterned && i - kMaxInterned < ct_extra_.size()) return &ct_extra_[i - kMaxInterned];
  return nullptr;
}

void Core::AfterIo() {
  if (arena_size_ - arena_used_ < kReadSize) Flush();
  else Schedule();
}

void Core::Schedule() {
  if (events_.empty() || scheduled_ || flushing_ || shutting_down_) return;
  scheduled_ = true;
  uv_check_start(&check_, &Core::OnCheck);
  uv_idle_start(&idle_, &Core::OnIdle);  // keeps the poll phase from blocking until the check runs
}

void Core::Flush() {
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

void Core::Shutdown() {
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

void Core::Finish() {
  host_->CoreFinished();
  delete this;
}

void Core::OnTick(uv_timer_t* h) {
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

double Core::OpenConnections() const {
  double open = 0;
  for (const Conn* k = conns_; k != nullptr; k = k->next) open++;
  return open;
}

void Core::OnCoreHandleClosed(uv_handle_t* h) { static_cast<Core*>(h->data)->HandleClosed(); }
void Core::OnCheck(uv_check_t* h) { static_cast<Core*>(h->data)->Flush(); }
void Core::OnIdle(uv_idle_t*) {}

// ---- connection -------------------------------------------------------------------------------

Conn::Conn(Core* c, Pool* p) : core(c), pool(p), gen(p->gen) {
  uv_tcp_init(c->loop(), &tcp);
  tcp.data = this;
  creq.data = this;
  wreq.data = this;
  uv_tcp_nodelay(&tcp, 1);
}

int Conn::Connect(const sockaddr* addr) { return uv_tcp_connect(&creq, &tcp, addr, &Conn::OnConnect); }

void Conn::Resume(uint64_t now) {
  active_at = now;
  SetReading(true);
}

void Conn::OnAlloc(uv_handle_t* h, size_t, uv_buf_t* buf) {
  Conn* k = static_cast<Conn*>(h->data);
  size_t len;
  buf->base = k->core->ArenaTail(&len);
  buf->len = len;
}

void Conn::OnRead(uv_stream_t* s, ssize_t n, const uv_buf_t* buf) {
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

void Conn::OnWrite(uv_write_t* req, int status) {
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

void Conn::OnClosed(uv_handle_t* h) {
  Conn* k = static_cast<Conn*>(h->data);
  Core* core = k->core;
  delete k;
  core->HandleClosed();
}

void Conn::OnConnect(uv_connect_t* req, int status) {
  Conn* k = static_cast<Conn*>(req->data);
  Core* core = k->core;
  if (k->closing || status == UV_ECANCELED) return;
  if (status < 0) {
    k->Fail(status, kRConnect);
  } else {
    k->connected = true;
    k->active_at = core->Now() - k->waited;  // a queued call's wait counts toward its headers limit
    k->limit_ms = core->headers_ms();
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
  limit_ms = connected ? core->headers_ms() : core->connect_ms();
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
  uv_close(reinterpret_cast<uv_handle_t*>(&tcp), OnClosed);
  core->Drain(pool);
}

void Conn::Complete(bool extra_bytes) {
  Call* c = call;
  call = nullptr;
  core->Push(kEvEnd, c->id, 0, 0);
  const bool was_paused = c->paused;
  c->conn = nullptr;
  core->FreeCall(c);
  if (!parser.keep_alive() || writing || extra_bytes || out.size() > out_off || core->closed() || pool->closed ||
      gen != pool->gen) {
    Close();
    return;
  }
  (void)was_paused;
  reused = true;
  active_at = core->Now();
  core->Release(this);
}

void Conn::OnHead(const h1::Head& h) {
  limit_ms = core->body_ms();
  active_at = core->Now();  // the body phase starts
  core->Push(kEvHead, call->id, h.status, core->InternContentType(h.type, h.type_len), h.length);
}

void Conn::OnBody(char* p, size_t n) { core->PushData(call, p, n); }

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

}  // namespace upstream
}  // namespace switchyard
