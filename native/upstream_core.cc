// Connections of the native upstream client (upstream_core.h): libuv
// callbacks, request writes, timeouts, and the glue to the response parser.
#include "upstream_core.h"

namespace switchyard {
namespace upstream {

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
  if (!parser.keep_alive() || writing || extra_bytes || out.size() > out_off || core->closed_ || pool->closed) {
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

}  // namespace upstream
}  // namespace switchyard
