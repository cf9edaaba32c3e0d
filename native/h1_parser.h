// The HTTP/1.1 response parser of the native upstream client, on its own:
// no libuv, no N-API, so tests can drive it directly (the addon exports a
// test-only entry point over it, and test/native-h1-parser.property.test.ts compares
// it with the plain TS model in test/reference/h1-response.ts).
//
// What it accepts (RFC 9112, and the same rules as src/proxy/h1-parser.ts,
// the TS client's parser; test/h1-conformance.test.ts holds both to them):
// - a head ends at the first CRLFCRLF and may be at most kMaxHead bytes
//   (status line, fields and the blank line); the bound does not depend on how
//   the bytes were split into reads;
// - status line "HTTP/1.d SSS" then SP, CR or LF; status 100-599 except 101;
//   1xx heads are skipped (any number of them), the next head follows;
// - Connection is a comma-separated, case-insensitive token list over every
//   Connection field: a "close" token closes the connection after the
//   response; HTTP/1.0 keeps it open only with a "keep-alive" token;
// - Transfer-Encoding is a token list too: chunked when its last coding is
//   "chunked"; present but not chunked-final: the body runs until close;
//   present with Content-Length: Transfer-Encoding wins and the connection
//   is closed after the response (RFC 9112 6.3 item 3);
// - Content-Length: digits only, at most 2^53-1, repeated fields must agree;
// - 204 and 304 have no body whatever the head says;
// - chunk size: 1-12 hex digits, then an optional extension (after ';', SP or
//   HTAB, at most kMaxChunkExt bytes) and CRLF (a bare LF is accepted);
//   chunk data must be followed by CRLF (or a bare LF), anything else is an
//   error; the trailer section (after the last chunk, up to its blank line)
//   may be at most kMaxTrailers bytes and its fields are ignored.
//
// Body bytes are de-chunked in place (framing bytes are squeezed out by
// moving data backwards), so one Feed yields at most one body piece, a range
// of the bytes it was given.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace switchyard {
namespace h1 {

constexpr size_t kMaxHead = 64 * 1024;
constexpr size_t kMaxTrailers = 64 * 1024;
constexpr uint32_t kMaxChunkExt = 4096;
constexpr int kMaxChunkDigits = 12;
constexpr double kMaxSafeInteger = 9007199254740991.0;

// Values are the native client's error reasons (bindings/upstream-client.ts).
enum class Error : int32_t { None = 0, BadStatus = 6, HeadTooLarge = 7, BadChunk = 8, BadLength = 9, Unexpected = 10 };

// The final head as the relay needs it. type points into the bytes given to Feed
// (or the parser's head buffer) and is valid during OnHead only.
struct Head {
  int status;
  const char* type;
  size_t type_len;
  double length;  // -1: no Content-Length (chunked or until close)
};

enum class Result { More, Done, Fail };

namespace detail {

inline char Lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c + 32) : c; }

inline bool IEq(const char* a, size_t n, const char* lower, size_t m) {
  if (n != m) return false;
  for (size_t i = 0; i < n; i++)
    if (Lower(a[i]) != lower[i]) return false;
  return true;
}

inline bool Ows(char c) { return c == ' ' || c == '\t'; }

// Calls f(token, len) for each element of a comma-separated list (OWS trimmed, empty ones skipped).
template <class F>
void ForEachToken(const char* v, size_t n, F&& f) {
  size_t i = 0;
  while (i <= n) {
    size_t j = i;
    while (j < n && v[j] != ',') j++;
    size_t a = i, b = j;
    while (a < b && Ows(v[a])) a++;
    while (b > a && Ows(v[b - 1])) b--;
    if (b > a) f(v + a, b - a);
    i = j + 1;
  }
}

}  // namespace detail

class ResponseParser {
 public:
  // Expect a new response (its head first).
  void Start() {
    st_ = St::Head;
    head_.clear();
    keep_alive_ = true;
    error_ = Error::None;
  }

  // After a Done: whether the connection may carry another request.
  bool keep_alive() const { return keep_alive_; }
  Error error() const { return error_; }
  // Bytes of the last Feed that belonged to the response (set on Done).
  size_t consumed() const { return consumed_; }
  bool in_head() const { return st_ == St::Head; }
  bool idle() const { return st_ == St::Idle; }

  // The peer closed the connection: true when that ends the response (a body
  // delimited by close); false when the response is incomplete.
  bool Eof() {
    if (st_ != St::BodyClose) return false;
    st_ = St::Idle;
    keep_alive_ = false;
    return true;
  }

  // Feeds n bytes. Calls sink.OnHead(const Head&) for the final head and
  // sink.OnBody(char* p, size_t n) at most once, with a range of [p, p + n)
  // (the bytes are modified in place by de-chunking). Returns Done when the
  // response ended (consumed() bytes were its), Fail on malformed input
  // (error() says why; body bytes before the bad byte were delivered), More
  // when it needs more bytes.
  template <class Sink>
  Result Feed(char* p, size_t n, Sink& sink) {
    char* d0 = nullptr;  // start of this call's (de-chunked) body bytes
    char* w = nullptr;   // where the next body byte goes
    auto take = [&](char* src, size_t len) {
      if (len == 0) return;
      if (d0 == nullptr) d0 = w = src;
      if (w != src) memmove(w, src, len);
      w += len;
    };
    auto emit = [&]() {
      if (d0 != nullptr && w > d0) sink.OnBody(d0, static_cast<size_t>(w - d0));
      d0 = w = nullptr;
    };
    auto fail = [&](Error e) {
      emit();
      error_ = e;
      st_ = St::Idle;
      return Result::Fail;
    };
    auto done = [&](size_t i) {
      emit();
      consumed_ = i;
      st_ = St::Idle;
      return Result::Done;
    };
    size_t i = 0;
    while (i < n) {
      switch (st_) {
        case St::Head: {
          size_t hl;        // length of the complete head
          const char* h;    // its first byte
          size_t advance;   // bytes of this call it used
          if (head_.empty()) {
            const void* e = memmem(p + i, n - i, "\r\n\r\n", 4);
            if (e == nullptr) {
              if (n - i >= kMaxHead) return fail(Error::HeadTooLarge);  // the head would exceed kMaxHead
              head_.assign(p + i, n - i);
              return Result::More;
            }
            hl = static_cast<size_t>(static_cast<const char*>(e) - (p + i)) + 4;
            h = p + i;
            advance = hl;
          } else {
            const size_t old = head_.size();
            head_.append(p + i, n - i);
            const size_t from = old >= 3 ? old - 3 : 0;
            const void* e = memmem(head_.data() + from, head_.size() - from, "\r\n\r\n", 4);
            if (e == nullptr) {
              if (head_.size() >= kMaxHead) return fail(Error::HeadTooLarge);
              return Result::More;
            }
            hl = static_cast<size_t>(static_cast<const char*>(e) - head_.data()) + 4;
            h = head_.data();
            advance = hl - old;
          }
          if (hl > kMaxHead) return fail(Error::HeadTooLarge);
          const Error err = ParseHead(h, hl, sink);
          if (err != Error::None) return fail(err);
          i += advance;
          head_.clear();
          if (st_ == St::BodyLength && remaining_ == 0) return done(i);
          break;
        }
        case St::BodyLength: {
          const size_t len = static_cast<size_t>(remaining_ < n - i ? remaining_ : n - i);
          take(p + i, len);
          i += len;
          remaining_ -= len;
          if (remaining_ == 0) return done(i);
          break;
        }
        case St::BodyClose:
          take(p + i, n - i);
          i = n;
          break;
        case St::ChunkSize: {
          const char ch = p[i++];
          int v = -1;
          if (ch >= '0' && ch <= '9') v = ch - '0';
          else if (ch >= 'a' && ch <= 'f') v = ch - 'a' + 10;
          else if (ch >= 'A' && ch <= 'F') v = ch - 'A' + 10;
          if (v >= 0) {
            if (++digits_ > kMaxChunkDigits) return fail(Error::BadChunk);
            chunk_size_ = chunk_size_ * 16 + static_cast<uint64_t>(v);
            break;
          }
          if (digits_ == 0) return fail(Error::BadChunk);
          if (ch == ';' || ch == ' ' || ch == '\t') {
            st_ = St::ChunkExt;
            line_len_ = 0;
          } else if (ch == '\r') {
            st_ = St::ChunkSizeLF;
          } else if (ch == '\n') {
            SizeLineDone();
          } else {
            return fail(Error::BadChunk);
          }
          break;
        }
        case St::ChunkExt: {
          const char ch = p[i++];
          if (ch == '\n') SizeLineDone();
          else if (++line_len_ > kMaxChunkExt) return fail(Error::BadChunk);
          break;
        }
        case St::ChunkSizeLF:
          if (p[i++] != '\n') return fail(Error::BadChunk);
          SizeLineDone();
          break;
        case St::ChunkData: {
          const size_t len = static_cast<size_t>(remaining_ < n - i ? remaining_ : n - i);
          take(p + i, len);
          i += len;
          remaining_ -= len;
          if (remaining_ == 0) st_ = St::ChunkDataCR;
          break;
        }
        case St::ChunkDataCR: {
          const char ch = p[i++];
          if (ch == '\r') st_ = St::ChunkDataLF;
          else if (ch == '\n') NextChunk();
          else return fail(Error::BadChunk);
          break;
        }
        case St::ChunkDataLF:
          if (p[i++] != '\n') return fail(Error::BadChunk);
          NextChunk();
          break;
        case St::Trailer: {
          const char ch = p[i++];
          if (++trailer_bytes_ > kMaxTrailers) return fail(Error::BadChunk);
          if (ch == '\n') {
            // a blank line ("" or a lone CR) ends the trailer section
            if (line_len_ == 0 || (line_len_ == 1 && line_cr_)) return done(i);
            line_len_ = 0;
            line_cr_ = false;
          } else {
            line_cr_ = line_len_ == 0 && ch == '\r';
            line_len_++;
          }
          break;
        }
        case St::Idle:
          return fail(Error::Unexpected);
      }
    }
    emit();
    return Result::More;
  }

 private:
  enum class St : uint8_t { Idle, Head, BodyLength, BodyClose, ChunkSize, ChunkExt, ChunkSizeLF, ChunkData, ChunkDataCR, ChunkDataLF, Trailer };

  void NextChunk() {
    st_ = St::ChunkSize;
    chunk_size_ = 0;
    digits_ = 0;
  }

  void SizeLineDone() {
    if (chunk_size_ == 0) {
      st_ = St::Trailer;
      line_len_ = 0;
      line_cr_ = false;
      trailer_bytes_ = 0;
    } else {
      st_ = St::ChunkData;
      remaining_ = chunk_size_;
    }
  }

  // One complete head h[0, len) (ends with CRLFCRLF). A 1xx head leaves the parser
  // waiting for the next head; a final one sets the body framing and calls OnHead.
  template <class Sink>
  Error ParseHead(const char* h, size_t len, Sink& sink) {
    using detail::IEq;
    if (len < 13 || memcmp(h, "HTTP/1.", 7) != 0 || h[7] < '0' || h[7] > '9' || h[8] != ' ' || h[9] < '0' ||
        h[9] > '9' || h[10] < '0' || h[10] > '9' || h[11] < '0' || h[11] > '9' ||
        (h[12] != ' ' && h[12] != '\r' && h[12] != '\n'))
      return Error::BadStatus;
    const int status = (h[9] - '0') * 100 + (h[10] - '0') * 10 + (h[11] - '0');
    // 101: the router never asks to switch protocols, so a 101 is not an interim head to skip
    if (status < 100 || status > 599 || status == 101) return Error::BadStatus;
    if (status < 200) return Error::None;  // 1xx informational: the real response follows
    const bool http10 = h[7] == '0';
    bool close_token = false, keep_alive_token = false, te = false, chunked = false;
    const char* ct = nullptr;
    size_t ct_len = 0;
    double cl = -1;
    const char* end = h + len;
    const char* p = static_cast<const char*>(memchr(h, '\n', len));
    while (p != nullptr && p + 1 < end) {
      const char* a = p + 1;
      const char* q = static_cast<const char*>(memchr(a, '\n', static_cast<size_t>(end - a)));
      const char* line_end = q == nullptr ? end : q;
      p = q;
      const char* colon = static_cast<const char*>(memchr(a, ':', static_cast<size_t>(line_end - a)));
      if (colon == nullptr) continue;
      const size_t nlen = static_cast<size_t>(colon - a);
      if (nlen != 12 && nlen != 14 && nlen != 17 && nlen != 10) continue;
      const char* v0 = colon + 1;
      const char* v1 = line_end;
      while (v0 < v1 && detail::Ows(*v0)) v0++;
      while (v1 > v0 && (v1[-1] == ' ' || v1[-1] == '\t' || v1[-1] == '\r')) v1--;
      const size_t vlen = static_cast<size_t>(v1 - v0);
      if (IEq(a, nlen, "content-type", 12)) {
        ct = v0;
        ct_len = vlen;
      } else if (IEq(a, nlen, "content-length", 14)) {
        if (vlen == 0) return Error::BadLength;
        double v = 0;
        for (const char* d = v0; d < v1; d++) {
          if (*d < '0' || *d > '9') return Error::BadLength;
          v = v * 10 + (*d - '0');
          if (v > kMaxSafeInteger) return Error::BadLength;
        }
        if (cl >= 0 && cl != v) return Error::BadLength;
        cl = v;
      } else if (IEq(a, nlen, "transfer-encoding", 17)) {
        // the last coding over all Transfer-Encoding fields decides
        te = true;
        detail::ForEachToken(v0, vlen, [&](const char* t, size_t tl) { chunked = IEq(t, tl, "chunked", 7); });
      } else if (IEq(a, nlen, "connection", 10)) {
        detail::ForEachToken(v0, vlen, [&](const char* t, size_t tl) {
          if (IEq(t, tl, "close", 5)) close_token = true;
          else if (IEq(t, tl, "keep-alive", 10)) keep_alive_token = true;
        });
      }
    }
    keep_alive_ = !close_token && (!http10 || keep_alive_token);
    if (status == 204 || status == 304) {
      st_ = St::BodyLength;  // no body, whatever the head says
      remaining_ = 0;
      cl = 0;
    } else if (te) {
      if (cl >= 0) keep_alive_ = false;  // both: Transfer-Encoding wins; the connection is not reused
      cl = -1;
      if (chunked) {
        NextChunk();
      } else {
        st_ = St::BodyClose;
        keep_alive_ = false;
      }
    } else if (cl >= 0) {
      st_ = St::BodyLength;
      remaining_ = static_cast<uint64_t>(cl);
    } else {
      st_ = St::BodyClose;
      keep_alive_ = false;
    }
    sink.OnHead(Head{status, ct, ct_len, cl});
    return Error::None;
  }

  std::string head_;  // a response head that spans reads
  uint64_t remaining_ = 0;
  uint64_t chunk_size_ = 0;
  size_t consumed_ = 0;
  size_t trailer_bytes_ = 0;
  uint32_t line_len_ = 0;
  int digits_ = 0;
  St st_ = St::Idle;
  Error error_ = Error::None;
  bool keep_alive_ = true;
  bool line_cr_ = false;
};

}  // namespace h1
}  // namespace switchyard
