// The native HTTP/1.1 front end (first part): a libuv listener on the
// environment's loop (napi_get_uv_event_loop), connections parsed by the
// strict request parser (h1_request_parser.h), requests delivered to
// JavaScript once each when whole (method, target, the head bytes with the
// field offsets, the body), answers written in request order (pipelined
// requests are parsed ahead, at most kMaxQueued per connection; their answers
// wait for the ones before), keep-alive per HTTP/1.1 and HTTP/1.0 rules, a
// parse error answered with its status and the connection closed, a body over
// the limit answered 413 and the rest of what the client sends drained (up to
// kDrainBytes and kDrainMs) before the close, a client that leaves seen at
// once (its queued requests reported aborted), a head timeout (408 where a
// request was begun) and an idle timeout.
//
// JS surface (bindings/front-end.ts, FrontServer):
//   new FrontServer(onRequest, onAbort, maxHead, maxLines, maxBody, headMs, idleMs)
//   listen(host, port) -> port; respond(id, status, headLines, body, end); write(id, chunk, end); close()
//   onRequest(id, method, target, minor, head: Buffer, offsets: Uint32Array, body: Buffer)
//   onAbort(id)
#include "front_server.h"

#include <uv.h>

#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "h1_request_parser.h"

namespace switchyard {
namespace {

constexpr size_t kMaxQueued = 16;           // requests parsed ahead of their answers, per connection
constexpr size_t kDrainBytes = 64u << 20;   // what a 413'd client may still send before the close
constexpr uint64_t kDrainMs = 2000;
constexpr size_t kReadBuf = 64 * 1024;
constexpr size_t kHighWater = 64 * 1024;    // queued answer bytes past which respond/write report "full"
constexpr size_t kLowWater = 16 * 1024;     // ... and onDrain fires once the socket's queue is below this

// A result of respond/write.
constexpr int kGone = 0, kSent = 1, kFull = 2;

// The transfer buffer's layout: field offsets (4 uint32 per field), then the head (max_head bytes), then a body.
constexpr size_t kXferOffsets = 16 * 1024;

// The reason phrase of an answer's status line (RFC 9110 section 15's names). RFC 9112 allows an empty
// one, but clients and scripts read `200 OK` (monitoring checks match it, as does curl's output), so the
// front end writes the names the router's answers use; a status not listed gets an empty phrase.
const char* ReasonPhrase(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 201: return "Created";
    case 202: return "Accepted";
    case 204: return "No Content";
    case 206: return "Partial Content";
    case 301: return "Moved Permanently";
    case 302: return "Found";
    case 304: return "Not Modified";
    case 307: return "Temporary Redirect";
    case 308: return "Permanent Redirect";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 402: return "Payment Required";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 406: return "Not Acceptable";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 410: return "Gone";
    case 411: return "Length Required";
    case 412: return "Precondition Failed";
    case 413: return "Payload Too Large";
    case 414: return "URI Too Long";
    case 415: return "Unsupported Media Type";
    case 416: return "Range Not Satisfiable";
    case 417: return "Expectation Failed";
    case 421: return "Misdirected Request";
    case 422: return "Unprocessable Entity";
    case 424: return "Failed Dependency";
    case 425: return "Too Early";
    case 426: return "Upgrade Required";
    case 428: return "Precondition Required";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 451: return "Unavailable For Legal Reasons";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 505: return "HTTP Version Not Supported";
    case 507: return "Insufficient Storage";
    default: return "";
  }
}

class FrontServerWrap;

struct Pending {
  Pending(double i, bool keep, bool h10) : id(i), keep_alive(keep), http10(h10) {}
  double id;
  bool keep_alive;
  bool http10;
  bool head_sent = false;
  bool chunked_out = false;
  bool done = false;
  bool want_drain = false;  // respond/write said "full": onDrain(id) when the socket drains
  std::string out;  // bytes waiting until this request is the first of its connection
};

struct Conn {
  uv_tcp_t tcp;
  uv_timer_t timer;
  FrontServerWrap* server;
  std::string in;  // unparsed bytes: the current head, then the body
  h1req::RequestParser parser;
  h1req::ChunkedDecoder chunks;
  enum class St : uint8_t { Head, Body, Drain, Closing } st = St::Head;
  std::string body;
  double remaining = 0;
  bool chunked = false;
  bool reading = true;
  bool shut = false;
  size_t drained = 0;
  std::deque<Pending> queue;
  uint32_t writes = 0;  // writes in flight
  int handles = 2;       // the tcp and the timer, counted down by their close callbacks
  uint64_t due = 0;      // when the armed timeout is due (uv_now ms; see Arm)
  size_t body_at = 0;    // where the body starts in `in`
  double limit = 0;      // the body limit of the current request
  bool head_armed = false;
  bool closing = false;
  explicit Conn(h1req::Limits l) : parser(l) {}
};

struct WriteReq {
  uv_write_t req;
  std::string data;
  Conn* conn;
  bool close_after;
};

class FrontServerWrap : public Napi::ObjectWrap<FrontServerWrap> {
 public:
  static Napi::Function Define(Napi::Env env) {
    return DefineClass(env, "FrontServer",
                       {
                           InstanceMethod<&FrontServerWrap::Listen>("listen"),
                           InstanceMethod<&FrontServerWrap::Respond>("respond"),
                           InstanceMethod<&FrontServerWrap::Write>("write"),
                           InstanceMethod<&FrontServerWrap::Close>("close"),
                           InstanceMethod<&FrontServerWrap::Abort>("abort"),
                           InstanceMethod<&FrontServerWrap::Unlisten>("unlisten"),
                           InstanceMethod<&FrontServerWrap::SetAccepting>("setAccepting"),
                           InstanceMethod<&FrontServerWrap::Stats>("stats"),
                       });
  }

  explicit FrontServerWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<FrontServerWrap>(info) {
    Napi::Env env = info.Env();
    if (info.Length() < 7 || !info[0].IsFunction() || !info[1].IsFunction()) {
      Napi::TypeError::New(env, "new FrontServer(onRequest, onAbort, maxHead, maxLines, maxBody, headMs, idleMs)").ThrowAsJavaScriptException();
      return;
    }
    double v[5];
    for (int i = 0; i < 5; i++) {
      if (!info[2 + i].IsNumber()) {
        Napi::TypeError::New(env, "limits and timeouts must be numbers").ThrowAsJavaScriptException();
        return;
      }
      v[i] = info[2 + i].As<Napi::Number>().DoubleValue();
      if (!(v[i] >= 1 && v[i] <= 9007199254740991.0)) {
        Napi::RangeError::New(env, "limits and timeouts must be positive").ThrowAsJavaScriptException();
        return;
      }
    }
    limits_.max_head = static_cast<size_t>(v[0]);
    limits_.max_lines = static_cast<uint32_t>(v[1] > h1req::kMaxFields ? h1req::kMaxFields : v[1]);
    max_body_ = v[2];
    head_ms_ = static_cast<uint64_t>(v[3]);
    idle_ms_ = static_cast<uint64_t>(v[4]);
    body_ms_ = head_ms_;
    max_file_ = max_body_;
    if (info.Length() > 7 && info[7].IsObject()) {  // options: onDrain, onReject, wanted, bodyMs, maxConnections, maxFileBody
      Napi::Object o = info[7].As<Napi::Object>();
      Napi::Value d = o.Get("onDrain");
      if (d.IsFunction()) on_drain_ = Napi::Persistent(d.As<Napi::Function>());
      Napi::Value rj = o.Get("onReject");
      if (rj.IsFunction()) on_reject_ = Napi::Persistent(rj.As<Napi::Function>());
      Napi::Value xb = o.Get("transfer");
      if (xb.IsArrayBuffer()) {
        Napi::ArrayBuffer ab = xb.As<Napi::ArrayBuffer>();
        if (ab.ByteLength() >= kXferOffsets + limits_.max_head) {
          xfer_ref_ = Napi::Persistent(ab);
          xfer_ = static_cast<char*>(ab.Data());
          xfer_len_ = ab.ByteLength();
        }
      }
      Napi::Value w = o.Get("wanted");
      if (w.IsArray()) {
        Napi::Array a = w.As<Napi::Array>();
        for (uint32_t i = 0; i < a.Length() && i < 64; i++) {
          std::string n = a.Get(i).ToString().Utf8Value();
          for (char& ch : n) ch = static_cast<char>(ch >= 'A' && ch <= 'Z' ? ch + 32 : ch);
          wanted_.push_back(std::move(n));
        }
      }
      auto num = [&](const char* k, double lo, double& out) {
        Napi::Value x = o.Get(k);
        if (x.IsNumber() && x.As<Napi::Number>().DoubleValue() >= lo) out = x.As<Napi::Number>().DoubleValue();
      };
      double bms = static_cast<double>(body_ms_), mc = 0;
      num("bodyMs", 1, bms);
      num("maxConnections", 0, mc);
      num("maxFileBody", 1, max_file_);
      body_ms_ = static_cast<uint64_t>(bms);
      max_conns_ = static_cast<size_t>(mc);
    }
    on_request_ = Napi::Persistent(info[0].As<Napi::Function>());
    on_abort_ = Napi::Persistent(info[1].As<Napi::Function>());
    if (napi_get_uv_event_loop(env, &loop_) != napi_ok || loop_ == nullptr) {
      Napi::Error::New(env, "no event loop").ThrowAsJavaScriptException();
      return;
    }
    napi_value name;
    napi_create_string_utf8(env, "SwitchyardFront", NAPI_AUTO_LENGTH, &name);
    napi_async_init(env, Napi::Object::New(env), name, &async_);
  }

  ~FrontServerWrap() override {
    if (async_ != nullptr) napi_async_destroy(Env(), async_);
  }

  // ---- libuv side ----

  static void OnConnection(uv_stream_t* l, int status) {
    FrontServerWrap* self = static_cast<FrontServerWrap*>(l->data);
    if (status < 0 || self->closed_) return;
    Conn* c = new Conn(self->limits_);
    c->server = self;
    uv_tcp_init(self->loop_, &c->tcp);
    uv_timer_init(self->loop_, &c->timer);
    c->tcp.data = c;
    c->timer.data = c;
    self->Ref();  // CloseConn's handle callbacks Unref
    if (uv_accept(l, reinterpret_cast<uv_stream_t*>(&c->tcp)) != 0) {
      self->CloseConn(c);
      return;
    }
    // over the connection limit, or not accepting (near the open-file limit): closed at once, so
    // the kernel's backlog does not fill with connections nobody serves
    if (!self->accepting_ || (self->max_conns_ > 0 && self->conns_.size() >= self->max_conns_)) {
      self->refused_++;
      self->CloseConn(c);
      return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    self->conns_[c] = true;
    uv_read_start(reinterpret_cast<uv_stream_t*>(&c->tcp), OnAlloc, OnRead);
    self->Arm(c, self->idle_ms_);
  }

  static void OnAlloc(uv_handle_t* h, size_t, uv_buf_t* buf) {
    FrontServerWrap* self = static_cast<Conn*>(h->data)->server;
    buf->base = self->rbuf_;
    buf->len = kReadBuf;
  }

  static void OnRead(uv_stream_t* s, ssize_t n, const uv_buf_t* buf) {
    Conn* c = static_cast<Conn*>(s->data);
    FrontServerWrap* self = c->server;
    if (n == 0) return;
    if (n < 0) {  // the client left (or a read error): abort what it asked and close
      self->CloseConn(c);
      return;
    }
    if (c->st == Conn::St::Drain) {
      c->drained += static_cast<size_t>(n);
      if (c->drained > kDrainBytes) self->CloseConn(c);
      return;
    }
    if (c->st == Conn::St::Closing) return;
    c->in.append(buf->base, static_cast<size_t>(n));
    self->Advance(c);
  }

  static void OnTimer(uv_timer_t* t) {
    Conn* c = static_cast<Conn*>(t->data);
    FrontServerWrap* self = c->server;
    const uint64_t now = uv_now(self->loop_);
    if (now < c->due) {  // the deadline moved on since the timer was armed (Arm)
      uv_timer_start(t, OnTimer, c->due - now, 0);
      return;
    }
    if (c->st == Conn::St::Drain) {
      self->CloseConn(c);
      return;
    }
    if (!c->queue.empty()) {  // waiting on our own answer: not the client's fault; looked at again later
      if (c->st == Conn::St::Body) self->Arm(c, self->body_ms_);
      else if (c->st == Conn::St::Head && c->parser.begun()) self->Arm(c, self->head_ms_);
      return;
    }
    if (c->st == Conn::St::Body || (c->st == Conn::St::Head && c->parser.begun())) self->Reject(c, 408);
    else self->CloseConn(c);
  }

  // A timeout from now. Lazily: a later deadline than the armed one (the idle timeout after each answer,
  // the body timeout at each read) is only recorded, and the timer, when it fires early, re-arms for the
  // rest; so a keep-alive request costs no timer-heap change.
  void Arm(Conn* c, uint64_t ms) {
    const uint64_t due = uv_now(loop_) + ms;
    if (uv_is_active(reinterpret_cast<uv_handle_t*>(&c->timer)) && due >= c->due) {
      c->due = due;
      return;
    }
    c->due = due;
    uv_timer_start(&c->timer, OnTimer, ms, 0);
  }

  // Parse what has been read: heads, bodies, as many requests as the queue bound allows.
  void Advance(Conn* c) {
    while (c->st == Conn::St::Head || c->st == Conn::St::Body) {
      if (c->queue.size() >= kMaxQueued) {  // parsed far enough ahead: wait for answers
        if (c->reading) uv_read_stop(reinterpret_cast<uv_stream_t*>(&c->tcp));
        c->reading = false;
        return;
      }
      if (c->st == Conn::St::Head) {
        if (c->in.empty()) return;
        const h1req::Result r = c->parser.Feed(c->in.data(), c->in.size());
        if (r == h1req::Result::More) {
          if (!c->head_armed && c->parser.begun()) {  // the head timeout runs from its first byte, not from each read
            c->head_armed = true;
            Arm(c, head_ms_);
          }
          return;
        }
        if (r == h1req::Result::Fail) {
          Reject(c, c->parser.status());
          return;
        }
        const h1req::RequestHead& h = c->parser.head();
        c->limit = IsFileTarget(c->in.data() + h.target.at, h.target.len) ? max_file_ : max_body_;
        if (h.length > c->limit) {
          Reject(c, 413, h.length);
          return;
        }
        c->chunked = h.chunked;
        c->remaining = h.length < 0 ? 0 : h.length;
        c->body.clear();
        if (c->chunked) c->chunks.Reset();
        if (h.expect_continue && (c->chunked || c->remaining > 0) && c->queue.empty()) {
          Send(c, std::string("HTTP/1.1 100 Continue\r\n\r\n"), false);
        }
        c->st = Conn::St::Body;
        c->body_at = h.head_len;
        // the body timeout (limits.requestBodyTimeoutMs) runs from the end of the head, not from each read:
        // a body trickled in a byte at a time gets its 408 as a stalled one does
        if (c->chunked || c->remaining > 0) Arm(c, body_ms_);
      }
      // Body
      const size_t at = c->body_at;
      if (c->chunked) {
        size_t out = 0;
        char* p = c->in.data() + at;
        const h1req::Result r = c->chunks.Feed(p, c->in.size() - at, &out);
        c->body.append(p, out);
        if (r == h1req::Result::Fail) {
          Reject(c, 400);
          return;
        }
        if (static_cast<double>(c->body.size()) > c->limit) {
          Reject(c, 413);
          return;
        }
        if (r == h1req::Result::More) {
          c->in.resize(at);  // all of it consumed: framing dropped, data kept in body
          return;
        }
        Deliver(c, at + c->chunks.consumed(), c->body.data(), c->body.size());
      } else {
        const size_t have = c->in.size() - at;
        if (static_cast<double>(have) < c->remaining) return;
        // the body is handed over from where it was read (no copy into c->body first)
        Deliver(c, at + static_cast<size_t>(c->remaining), c->in.data() + at, static_cast<size_t>(c->remaining));
      }
    }
  }

  // A whole request: queue its answer slot, hand it to JavaScript, keep the bytes after it.
  void Deliver(Conn* c, size_t end, const char* bp, size_t bn) {
    const h1req::RequestHead& h = c->parser.head();
    const double id = ++next_id_;
    c->queue.emplace_back(id, h.keep_alive, h.minor == 0);
    requests_[id] = c;
    Napi::Env env = Env();
    {
      Napi::HandleScope scope(env);
      const char* base = c->in.data();
      // with a transfer buffer (the router's case): offsets, head and a body that fits are copied into
      // it, no ArrayBuffer per request (JavaScript reads them during the call); else a copy of each
      napi_value head, offsets, body;
      const size_t head_at = kXferOffsets, body_at = kXferOffsets + limits_.max_head;
      const bool xfer = xfer_ != nullptr && h.field_count * 16 <= kXferOffsets && h.head_len <= limits_.max_head;
      const bool body_in = xfer && bn <= xfer_len_ - body_at;
      if (xfer) {
        uint32_t* o = reinterpret_cast<uint32_t*>(xfer_);
        for (uint32_t k = 0; k < h.field_count; k++) {
          o[k * 4] = h.fields[k].name.at;
          o[k * 4 + 1] = h.fields[k].name.len;
          o[k * 4 + 2] = h.fields[k].value.at;
          o[k * 4 + 3] = h.fields[k].value.len;
        }
        memcpy(xfer_ + head_at, base, h.head_len);
        napi_create_uint32(env, h.head_len, &head);
        napi_create_uint32(env, h.field_count, &offsets);
      } else {
        head = Napi::Buffer<char>::Copy(env, base, h.head_len);
        Napi::Uint32Array oa = Napi::Uint32Array::New(env, h.field_count * 4);
        for (uint32_t k = 0; k < h.field_count; k++) {
          oa[k * 4] = h.fields[k].name.at;
          oa[k * 4 + 1] = h.fields[k].name.len;
          oa[k * 4 + 2] = h.fields[k].value.at;
          oa[k * 4 + 3] = h.fields[k].value.len;
        }
        offsets = oa;
      }
      if (body_in) {
        if (bn > 0) memcpy(xfer_ + body_at, bp, bn);
        napi_create_uint32(env, static_cast<uint32_t>(bn), &body);
      } else {
        body = Napi::Buffer<char>::Copy(env, bp, bn);
      }
      napi_value method, target;
      napi_create_string_latin1(env, base + h.method.at, h.method.len, &method);
      napi_create_string_latin1(env, base + h.target.at, h.target.len, &target);
      // the values of the fields the router reads (one string each, '' when absent, repeated lines joined
      // with ','): no JavaScript walk of the head per request
      napi_value wanted;
      napi_create_array_with_length(env, wanted_.size(), &wanted);
      for (uint32_t w = 0; w < wanted_.size(); w++) {
        const std::string& n = wanted_[w];
        std::string joined;
        const char* one = nullptr;
        size_t one_len = 0;
        int seen = 0;
        for (uint32_t k = 0; k < h.field_count; k++) {
          const h1req::Field& f = h.fields[k];
          if (f.name.len != n.size() || !SameLower(base + f.name.at, n)) continue;
          if (seen == 0) {
            one = base + f.value.at;
            one_len = f.value.len;
          } else {
            if (seen == 1) joined.assign(one, one_len);
            joined += ',';
            joined.append(base + f.value.at, f.value.len);
          }
          seen++;
        }
        if (seen == 0) continue;  // absent: a hole (undefined in JavaScript), no string and no store
        napi_value v;
        if (seen > 1) napi_create_string_latin1(env, joined.data(), joined.size(), &v);
        else napi_create_string_latin1(env, one, one_len, &v);
        napi_set_element(env, wanted, w, v);
      }
      napi_value argv[8] = {Napi::Number::New(env, id), method, target, Napi::Number::New(env, h.minor), head, offsets, body, wanted};
      const bool keep = h.keep_alive;
      c->in.erase(0, end);
      c->parser.Reset();
      c->body.clear();
      c->head_armed = false;
      c->st = keep ? Conn::St::Head : Conn::St::Closing;  // no request after one that closes
      CallBatched(on_request_, 8, argv);
    }
    if (c->st == Conn::St::Closing) uv_timer_stop(&c->timer);
  }

  // A request's callback: a plain call (no callback scope per request); the microtasks and nextTicks it
  // queued run once per loop iteration, for every request of that iteration, when the check handle
  // enters a callback scope (OnCheck), as uWebSockets.js does. Before listen (no check handle): Call.
  void CallBatched(Napi::FunctionReference& fn, size_t argc, napi_value* argv) {
    if (!check_init_) {
      Call(fn, argc, argv);
      return;
    }
    napi_env env = Env();
    napi_value recv, result;
    napi_get_global(env, &recv);
    if (napi_call_function(env, recv, fn.Value(), argc, argv, &result) == napi_pending_exception) {
      napi_value err;
      napi_get_and_clear_last_exception(env, &err);
      napi_fatal_exception(env, err);
    }
    if (!check_armed_) {
      check_armed_ = true;
      uv_check_start(&check_, OnCheck);
    }
  }

  static void OnCheck(uv_check_t* h) {
    FrontServerWrap* self = static_cast<FrontServerWrap*>(h->data);
    self->check_armed_ = false;
    uv_check_stop(h);
    Napi::HandleScope scope(self->Env());
    self->Call(self->noop_, 0, nullptr);  // leaving the callback scope runs the queued ticks and microtasks
    if (self->drains_.empty() || self->on_drain_.IsEmpty()) return;
    std::vector<double> ids;
    ids.swap(self->drains_);
    for (double id : ids) {
      if (self->requests_.find(id) == self->requests_.end()) continue;  // answered or gone since
      napi_value argv[1] = {Napi::Number::New(self->Env(), id)};
      self->Call(self->on_drain_, 1, argv);
    }
  }

  // onDrain(id) from the check handle (this loop iteration's end): never from inside a call from JS.
  void QueueDrain(double id) {
    drains_.push_back(id);
    if (!check_armed_ && check_init_) {
      check_armed_ = true;
      uv_check_start(&check_, OnCheck);
    }
  }

  void Call(Napi::FunctionReference& fn, size_t argc, napi_value* argv) {
    napi_env env = Env();
    napi_value recv, result;
    napi_get_global(env, &recv);
    if (napi_make_callback(env, async_, recv, fn.Value(), argc, argv, &result) == napi_pending_exception) {
      napi_value err;
      napi_get_and_clear_last_exception(env, &err);
      napi_fatal_exception(env, err);
    }
  }

  // A framing error (or 408, 413): answer it after the answers before it, then close (413: drain first).
  // declared: the Content-Length of a 413'd body (-1: unknown, chunked).
  void Reject(Conn* c, int status, double declared = -1) {
    const char* reason = ReasonPhrase(status);
    std::string text;
    if (status == 413) {
      char lim[32], dec[32];
      snprintf(lim, sizeof(lim), "%.0f", c->limit);
      snprintf(dec, sizeof(dec), "%.0f", declared);
      text = declared >= 0 ? std::string("request body of ") + dec + " bytes exceeds the limit of " + lim + " bytes"
                           : std::string("request body exceeds the limit of ") + lim + " bytes";
    } else {
      text = status == 400   ? "bad request: the request's framing is malformed (RFC 9112)"
             : status == 408 ? "the request did not arrive in time"
             : status == 417 ? "unsupported Expect (only 100-continue)"
             : status == 431 ? "request header fields too large (too many lines or too many bytes)"
             : status == 501 ? "unsupported transfer coding (only chunked)"
             : status == 505 ? "HTTP version not supported (HTTP/1.0 and HTTP/1.1 are)"
                             : reason;
    }
    std::string msg = "{\"error\":{\"message\":\"" + text + "\",\"type\":\"" + (status >= 500 ? "server_error" : "invalid_request_error") + "\",\"param\":null,\"code\":" +
                      (status == 413 ? "\"request_too_large\"" : "null") + "}}";
    if (!on_reject_.IsEmpty()) {
      Napi::HandleScope scope(Env());
      napi_value argv[1] = {Napi::Number::New(Env(), status)};
      Call(on_reject_, 1, argv);
    }
    std::string out = "HTTP/1.1 " + std::to_string(status) + " " + reason + "\r\ncontent-type: application/json\r\ncontent-length: " +
                      std::to_string(msg.size()) + "\r\nconnection: close\r\n\r\n" + msg;
    c->st = status == 413 ? Conn::St::Drain : Conn::St::Closing;
    c->in.clear();
    if (status == 413) {
      if (!c->reading) uv_read_start(reinterpret_cast<uv_stream_t*>(&c->tcp), OnAlloc, OnRead);
      c->reading = true;
      Arm(c, kDrainMs);
    } else {
      uv_timer_stop(&c->timer);
    }
    c->queue.emplace_back(0, false, false);
    c->queue.back().out = std::move(out);
    c->queue.back().done = true;
    Flush(c);
  }

  // Writes the answers at the front of the queue that are ready, in order.
  void Flush(Conn* c) {
    while (!c->queue.empty()) {
      Pending& p = c->queue.front();
      if (!p.out.empty()) {
        Send(c, std::move(p.out), false);
        p.out.clear();
        // a slot that said "full" while it waited, now sent: uv_try_write may have taken it whole (no write
        // completion, so OnWritten never tells it); its drain goes out from the check handle instead
        if (p.want_drain && !p.done && c->tcp.write_queue_size < kLowWater) {
          p.want_drain = false;
          QueueDrain(p.id);
        }
      }
      if (!p.done) return;
      const bool keep = p.keep_alive;
      if (p.id != 0) requests_.erase(p.id);
      c->queue.pop_front();
      if (!keep) {
        for (Pending& q : c->queue)  // requests after one that closes are never answered
          if (q.id != 0) requests_.erase(q.id);
        c->queue.clear();
        if (c->st == Conn::St::Drain) {
          ShutdownWrite(c);  // keep reading (and discarding) until the client closes, or the bound
        } else {
          c->st = Conn::St::Closing;
          Send(c, std::string(), true);
        }
        return;
      }
    }
    if (!c->reading && c->st != Conn::St::Closing) {  // room in the queue again
      c->reading = true;
      uv_read_start(reinterpret_cast<uv_stream_t*>(&c->tcp), OnAlloc, OnRead);
    }
    if (c->st == Conn::St::Head) {
      if (c->in.empty()) Arm(c, idle_ms_);
      Advance(c);
    }
  }

  // An answer's bytes: written at once where the socket takes them (uv_try_write: no write request,
  // no completion callback, no epoll change per answer), the rest (or a close after them) through uv_write.
  void Send(Conn* c, std::string data, bool close_after) {
    if (c->shut) return;
    if (!close_after && c->writes == 0 && !data.empty()) {
      uv_buf_t t = uv_buf_init(data.data(), static_cast<unsigned>(data.size()));
      const int n = uv_try_write(reinterpret_cast<uv_stream_t*>(&c->tcp), &t, 1);
      if (n == static_cast<int>(data.size())) return;
      if (n > 0) data.erase(0, static_cast<size_t>(n));
      // n < 0 (EAGAIN, or an error that uv_write reports through OnWritten): all of it goes below
    }
    WriteReq* w = new WriteReq;
    w->data = std::move(data);
    w->conn = c;
    w->close_after = close_after;
    w->req.data = w;
    uv_buf_t b = uv_buf_init(w->data.data(), static_cast<unsigned>(w->data.size()));
    c->writes++;
    if (uv_write(&w->req, reinterpret_cast<uv_stream_t*>(&c->tcp), &b, 1, OnWritten) != 0) {
      c->writes--;
      delete w;
      CloseConn(c);
    }
  }

  static void OnWritten(uv_write_t* req, int status) {
    WriteReq* w = static_cast<WriteReq*>(req->data);
    Conn* c = w->conn;
    const bool close_after = w->close_after;
    delete w;
    c->writes--;
    if (c->closing) return;
    if (status < 0 || close_after) {
      c->server->CloseConn(c);
      return;
    }
    if (!c->queue.empty() && c->queue.front().want_drain && c->tcp.write_queue_size < kLowWater) {
      Pending& f = c->queue.front();
      f.want_drain = false;
      FrontServerWrap* self = c->server;
      if (self->on_drain_.IsEmpty()) return;
      Napi::HandleScope scope(self->Env());
      napi_value argv[1] = {Napi::Number::New(self->Env(), f.id)};
      self->Call(self->on_drain_, 1, argv);
    }
  }

  // What respond/write report: kFull when the answer's bytes wait (in its own slot or the socket's queue).
  static int Pressure(Conn* c, Pending* p, double id) {
    if (c->closing) return kGone;
    // p may be gone from the queue (a finished answer): it is found again by id
    size_t queued = c->tcp.write_queue_size;
    for (Pending& q : c->queue) {
      if (q.id != id) continue;
      queued += q.out.size();
      if (queued > kHighWater && !q.done) {
        q.want_drain = true;
        return kFull;
      }
      break;
    }
    (void)p;
    return kSent;
  }

  void ShutdownWrite(Conn* c) {
    uv_shutdown_t* s = new uv_shutdown_t;
    s->data = c;
    c->shut = true;
    if (uv_shutdown(s, reinterpret_cast<uv_stream_t*>(&c->tcp), [](uv_shutdown_t* r, int) { delete r; }) != 0) {
      delete s;
      CloseConn(c);
    }
  }

  void CloseConn(Conn* c) {
    if (c->closing) return;
    c->closing = true;
    c->st = Conn::St::Closing;
    std::deque<Pending> queue;
    queue.swap(c->queue);
    for (Pending& p : queue) {
      if (p.id == 0) continue;
      requests_.erase(p.id);
      if (p.done) continue;
      Napi::HandleScope scope(Env());
      napi_value argv[1] = {Napi::Number::New(Env(), p.id)};
      Call(on_abort_, 1, argv);
    }
    conns_.erase(c);
    uv_timer_stop(&c->timer);
    auto done = [](uv_handle_t* h) {
      Conn* k = static_cast<Conn*>(h->data);
      if (--k->handles == 0) {
        FrontServerWrap* self = k->server;
        delete k;
        self->Unref();
      }
    };
    uv_close(reinterpret_cast<uv_handle_t*>(&c->timer), done);
    uv_close(reinterpret_cast<uv_handle_t*>(&c->tcp), done);
  }

  // ---- JS side ----

  Napi::Value Listen(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (info.Length() < 2 || !info[0].IsString() || !info[1].IsNumber()) {
      Napi::TypeError::New(env, "listen(host: string, port: number)").ThrowAsJavaScriptException();
      return env.Undefined();
    }
    if (listening_) {
      Napi::Error::New(env, "already listening").ThrowAsJavaScriptException();
      return env.Undefined();
    }
    const std::string host = info[0].As<Napi::String>().Utf8Value();
    const int port = info[1].As<Napi::Number>().Int32Value();
    sockaddr_storage addr;
    if (uv_ip4_addr(host.c_str(), port, reinterpret_cast<sockaddr_in*>(&addr)) != 0 &&
        uv_ip6_addr(host.c_str(), port, reinterpret_cast<sockaddr_in6*>(&addr)) != 0) {
      Napi::Error::New(env, "listen: not an IP address: " + host).ThrowAsJavaScriptException();
      return env.Undefined();
    }
    uv_tcp_init(loop_, &listener_);
    listener_.data = this;
    int r = uv_tcp_bind(&listener_, reinterpret_cast<const sockaddr*>(&addr), 0);
    if (r == 0) r = uv_listen(reinterpret_cast<uv_stream_t*>(&listener_), 511, OnConnection);
    if (r != 0) {
      uv_close(reinterpret_cast<uv_handle_t*>(&listener_), nullptr);
      Napi::Error::New(env, std::string("listen: ") + uv_strerror(r)).ThrowAsJavaScriptException();
      return env.Undefined();
    }
    listening_ = true;
    if (!check_init_) {
      uv_check_init(loop_, &check_);
      check_.data = this;
      uv_unref(reinterpret_cast<uv_handle_t*>(&check_));  // it never keeps the process alive
      check_init_ = true;
      noop_ = Napi::Persistent(Napi::Function::New(env, [](const Napi::CallbackInfo&) {}));
      Ref();  // until the check handle's close callback
    }
    Ref();
    sockaddr_storage bound;
    int len = sizeof(bound);
    uv_tcp_getsockname(&listener_, reinterpret_cast<sockaddr*>(&bound), &len);
    const int p = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                              : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    return Napi::Number::New(env, p);
  }

  // respond(id, status, headLines: string (latin1 "name: value\r\n"...), body: Buffer|null, end: boolean) -> boolean
  Napi::Value Respond(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (info.Length() < 5 || !info[0].IsNumber() || !info[1].IsNumber() || !info[2].IsString() || !info[4].IsBoolean()) {
      Napi::TypeError::New(env, "respond(id, status, headLines, body, end)").ThrowAsJavaScriptException();
      return env.Undefined();
    }
    const double id = info[0].As<Napi::Number>().DoubleValue();
    Pending* p = Find(id);
    if (p == nullptr || p->head_sent) return Napi::Number::New(env, kGone);
    if (info.Length() > 5 && info[5].IsBoolean() && info[5].As<Napi::Boolean>().Value()) p->keep_alive = false;  // close after it
    const int status = info[1].As<Napi::Number>().Int32Value();
    if (status < 200 || status > 599) {
      Napi::RangeError::New(env, "status must be in [200, 599]").ThrowAsJavaScriptException();
      return env.Undefined();
    }
    const bool end = info[4].As<Napi::Boolean>().Value();
    const char* body = nullptr;
    size_t blen = 0;
    const bool text = info[3].IsString();  // UTF-8, written straight into the answer: no Buffer made in JavaScript
    if (info[3].IsBuffer()) {
      body = info[3].As<Napi::Buffer<char>>().Data();
      blen = info[3].As<Napi::Buffer<char>>().Length();
    } else if (text) {
      napi_get_value_string_utf8(env, info[3], nullptr, 0, &blen);
    }
    size_t hl = 0;
    napi_get_value_string_latin1(env, info[2], nullptr, 0, &hl);
    std::string& out = p->out;
    out.reserve(out.size() + 96 + hl + blen);  // status line, head, framing lines, body: one allocation
    out += p->http10 ? "HTTP/1.0 " : "HTTP/1.1 ";
    out += std::to_string(status);
    out += ' ';
    out += ReasonPhrase(status);
    out += "\r\n";
    const size_t at = out.size();
    out.resize(at + hl + 1);
    napi_get_value_string_latin1(env, info[2], out.data() + at, hl + 1, &hl);
    out.resize(at + hl);
    const bool no_body = status == 204 || status == 304;
    if (end || no_body) {
      if (!no_body) out += "content-length: " + std::to_string(blen) + "\r\n";
    } else if (p->http10) {
      p->keep_alive = false;  // close-delimited
    } else {
      out += "transfer-encoding: chunked\r\n";
      p->chunked_out = true;
    }
    if (p->http10 && p->keep_alive) out += "connection: keep-alive\r\n";
    else if (!p->keep_alive) out += "connection: close\r\n";
    out += "\r\n";
    p->head_sent = true;
    if (text) AppendText(env, p, info[3], blen, end || no_body);
    else AppendBody(p, body, blen, end || no_body);
    Conn* c = requests_[id];
    Flush(c);
    return Napi::Number::New(env, Pressure(c, p, id));
  }

  // write(id, chunk: Buffer|null, end: boolean) -> boolean
  Napi::Value Write(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (info.Length() < 3 || !info[0].IsNumber() || !info[2].IsBoolean()) {
      Napi::TypeError::New(env, "write(id, chunk, end)").ThrowAsJavaScriptException();
      return env.Undefined();
    }
    const double id = info[0].As<Napi::Number>().DoubleValue();
    Pending* p = Find(id);
    if (p == nullptr || !p->head_sent || p->done) return Napi::Number::New(env, kGone);
    const char* body = nullptr;
    size_t blen = 0;
    const bool end = info[2].As<Napi::Boolean>().Value();
    if (info[1].IsString()) {
      napi_get_value_string_utf8(env, info[1], nullptr, 0, &blen);
      AppendText(env, p, info[1], blen, end);
    } else {
      if (info[1].IsBuffer()) {
        body = info[1].As<Napi::Buffer<char>>().Data();
        blen = info[1].As<Napi::Buffer<char>>().Length();
      }
      AppendBody(p, body, blen, end);
    }
    Conn* c = requests_[id];
    Flush(c);
    return Napi::Number::New(env, Pressure(c, p, id));
  }

  // A string body of n UTF-8 bytes, encoded straight into the answer's bytes.
  void AppendText(napi_env env, Pending* p, napi_value v, size_t n, bool end) {
    if (n == 0 || p->done) {
      AppendBody(p, nullptr, 0, end);
      return;
    }
    if (p->chunked_out) {
      char size[24];
      snprintf(size, sizeof(size), "%zx\r\n", n);
      p->out += size;
    }
    const size_t at = p->out.size();
    p->out.resize(at + n + 1);  // napi writes a terminating NUL
    size_t w = 0;
    napi_get_value_string_utf8(env, v, p->out.data() + at, n + 1, &w);
    p->out.resize(at + w);
    if (p->chunked_out) p->out += "\r\n";
    AppendBody(p, nullptr, 0, end);
  }

  void AppendBody(Pending* p, const char* b, size_t n, bool end) {
    if (p->chunked_out) {
      if (n > 0) {
        char size[24];
        snprintf(size, sizeof(size), "%zx\r\n", n);
        p->out += size;
        p->out.append(b, n);
        p->out += "\r\n";
      }
      if (end) p->out += "0\r\n\r\n";
    } else if (n > 0) {
      p->out.append(b, n);
    }
    if (end) p->done = true;
  }

  Pending* Find(double id) {
    auto it = requests_.find(id);
    if (it == requests_.end()) return nullptr;
    for (Pending& p : it->second->queue)
      if (p.id == id) return &p;
    return nullptr;
  }

  // abort(id): cuts the connection of a request (an answer that cannot be finished); its pending requests are aborted.
  Napi::Value Abort(const Napi::CallbackInfo& info) {
    if (info.Length() < 1 || !info[0].IsNumber()) return info.Env().Undefined();
    auto it = requests_.find(info[0].As<Napi::Number>().DoubleValue());
    if (it != requests_.end()) CloseConn(it->second);
    return info.Env().Undefined();
  }

  // unlisten(): stops accepting (the listening socket closes); open connections are served on.
  Napi::Value Unlisten(const Napi::CallbackInfo& info) {
    StopListening();
    return info.Env().Undefined();
  }

  // setAccepting(bool): false closes each new connection at once (the accept guard near the open-file limit).
  Napi::Value SetAccepting(const Napi::CallbackInfo& info) {
    if (info.Length() > 0 && info[0].IsBoolean()) accepting_ = info[0].As<Napi::Boolean>().Value();
    return info.Env().Undefined();
  }

  // stats() -> [open connections, connections refused (limit or not accepting)]
  Napi::Value Stats(const Napi::CallbackInfo& info) {
    Napi::Array a = Napi::Array::New(info.Env(), 2);
    a.Set(0u, Napi::Number::New(info.Env(), static_cast<double>(conns_.size())));
    a.Set(1u, Napi::Number::New(info.Env(), static_cast<double>(refused_)));
    return a;
  }

  void StopListening() {
    if (!listening_) return;
    listening_ = false;
    uv_close(reinterpret_cast<uv_handle_t*>(&listener_), [](uv_handle_t* h) { static_cast<FrontServerWrap*>(h->data)->Unref(); });
  }

  static bool SameLower(const char* p, const std::string& lower) {
    for (size_t i = 0; i < lower.size(); i++) {
      char ch = p[i];
      if (ch >= 'A' && ch <= 'Z') ch = static_cast<char>(ch + 32);
      if (ch != lower[i]) return false;
    }
    return true;
  }

  // The Files API's upload takes the larger limit (maxFileBody): /v1/files, then the end, '?' or '/'.
  static bool IsFileTarget(const char* t, size_t n) {
    static const char kP[] = "/v1/files";
    const size_t k = sizeof(kP) - 1;
    return n >= k && memcmp(t, kP, k) == 0 && (n == k || t[k] == '?' || t[k] == '/');
  }

  Napi::Value Close(const Napi::CallbackInfo& info) {
    if (closed_) return info.Env().Undefined();
    closed_ = true;
    StopListening();
    if (check_init_) {
      check_init_ = false;
      check_armed_ = false;
      uv_check_stop(&check_);
      uv_close(reinterpret_cast<uv_handle_t*>(&check_), [](uv_handle_t* h) { static_cast<FrontServerWrap*>(h->data)->Unref(); });
    }
    std::vector<Conn*> all;
    for (auto& kv : conns_) all.push_back(kv.first);
    for (Conn* c : all) CloseConn(c);
    return info.Env().Undefined();
  }

 private:
  uv_loop_t* loop_ = nullptr;
  uv_tcp_t listener_;
  bool listening_ = false;
  bool closed_ = false;
  bool accepting_ = true;
  size_t max_conns_ = 0;  // 0: no limit
  double refused_ = 0;
  double max_file_ = 16 << 20;
  uint64_t body_ms_ = 10000;
  std::vector<std::string> wanted_;
  uv_check_t check_;
  bool check_init_ = false;
  bool check_armed_ = false;
  Napi::FunctionReference noop_;
  std::vector<double> drains_;  // ids whose drain OnCheck sends (QueueDrain)
  Napi::Reference<Napi::ArrayBuffer> xfer_ref_;
  char* xfer_ = nullptr;
  size_t xfer_len_ = 0;
  Napi::FunctionReference on_drain_;
  Napi::FunctionReference on_reject_;
  h1req::Limits limits_;
  double max_body_ = 16 << 20;
  uint64_t head_ms_ = 10000, idle_ms_ = 10000;
  double next_id_ = 0;
  char rbuf_[kReadBuf];
  Napi::FunctionReference on_request_;
  Napi::FunctionReference on_abort_;
  napi_async_context async_ = nullptr;
  std::unordered_map<Conn*, bool> conns_;
  std::unordered_map<double, Conn*> requests_;
};

}  // namespace

void InitFrontServer(Napi::Env env, Napi::Object exports) { exports.Set("FrontServer", FrontServerWrap::Define(env)); }

}  // namespace switchyard
