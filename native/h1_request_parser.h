// The strict HTTP/1.1 request parser of the native front end, on its own: no
// libuv, no N-API, so tests drive it directly (the addon exports a test-only
// entry point over it, native/h1_request_probe.cc, used by
// test/native-h1-request-parser.test.ts).
//
// It tells an incomplete head (Result::More: wait for more bytes) from an
// invalid one (Result::Fail with the status to answer) as soon as the first
// offending byte arrives, whatever the read splits; every byte is looked at
// once (the head is fed as one growing buffer, the parser resumes where it
// stopped).
//
// What it accepts (RFC 9112 and RFC 9110):
// - empty lines (CRLF) before the request line are skipped, at most
//   kMaxLeadingEmpty of them;
// - request line: method (1*tchar) SP target SP "HTTP/" DIGIT "." DIGIT CRLF;
//   exactly one SP between parts; the target is any bytes but CTL, SP and DEL
//   (bytes >= 0x80 kept); anything else is 400; a version with a major other
//   than 1 is 505; HTTP/1.2 to 1.9 are served as 1.1 (RFC 9110 2.5);
// - field lines: name (1*tchar) ":" OWS value OWS CRLF; the value may hold
//   HTAB, SP, VCHAR and obs-text (>= 0x80, kept as bytes: only SP and HTAB are
//   trimmed); a line starting with SP or HTAB (obs-fold), a space before the
//   colon, NUL or any other control byte, a CR not followed by LF and a bare
//   LF are 400;
// - more than limits.max_lines field lines, or a head (request line, fields,
//   blank line) over limits.max_head bytes, is 431;
// - Content-Length: 1*DIGIT, at most 2^53-1; repeated lines must agree
//   (identical duplicates are allowed, RFC 9110 8.6), else 400;
// - Transfer-Encoding: at most one line, a token list whose last coding is
//   "chunked" (case-insensitive) and which names chunked once; chunked not last
//   (or absent from a present field) is 400 (RFC 9112 6.3), another coding
//   before it is 501 (RFC 9112 6.1: not understood); with Content-Length, or
//   in an HTTP/1.0 request, 400;
// - Host: exactly one in HTTP/1.1 (RFC 9112 3.2), at most one in HTTP/1.0;
// - Connection: a token list over every line: "close" closes after the
//   answer; HTTP/1.0 stays open only with "keep-alive";
// - Expect: "100-continue" (case-insensitive) is flagged, any other
//   expectation is 417.
//
// Chunked request bodies are decoded in place by ChunkedDecoder: chunk size
// 1..kMaxChunkDigits hex digits, an optional extension (';' after optional
// BWS, at most kMaxChunkExt bytes, no control bytes), CRLF strictly; data then
// CRLF; trailer lines (at most kMaxTrailers bytes in all, each ending CRLF, no
// NUL or bare CR/LF) are dropped. Anything else is 400.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "h1_parser.h"

namespace switchyard {
namespace h1req {

constexpr size_t kDefaultMaxHead = 64 * 1024;
constexpr uint32_t kDefaultMaxLines = 100;
constexpr uint32_t kMaxFields = 1024;  // the bound on limits.max_lines (fields are stored inline)
constexpr uint32_t kMaxLeadingEmpty = 8;
constexpr uint32_t kMaxChunkExt = 4096;
constexpr int kMaxChunkDigits = 12;
constexpr size_t kMaxTrailers = 16 * 1024;
constexpr uint64_t kMaxSafeInteger = 9007199254740991ull;

struct Limits {
  size_t max_head = kDefaultMaxHead;     // bytes, request line through the blank line
  uint32_t max_lines = kDefaultMaxLines;  // field lines
};

enum class Result { More, Done, Fail };

// Offsets into the head buffer (the bytes given to Feed), valid while it is.
struct Span {
  uint32_t at = 0;
  uint32_t len = 0;
};

struct Field {
  Span name;
  Span value;  // SP and HTAB trimmed at both ends
};

enum class TargetForm : uint8_t { Origin, Absolute, Authority, Asterisk };

struct RequestHead {
  Span method;
  Span target;
  TargetForm form = TargetForm::Origin;
  int minor = 1;           // 0: HTTP/1.0; 1: HTTP/1.1 (and 1.2-1.9)
  double length = -1;      // Content-Length, -1 when absent
  bool chunked = false;
  bool keep_alive = true;  // after this request's answer
  bool expect_continue = false;
  uint32_t head_len = 0;   // bytes of the head, leading empty lines included
  uint32_t field_count = 0;
  Field fields[kMaxFields];
};

namespace detail {

// tchar per RFC 9110 5.6.2: ALPHA DIGIT ! # $ % & ' * + - . ^ _ ` | ~
struct TcharTable {
  bool t[256];
  constexpr TcharTable() : t() {
    for (int c = 0; c < 256; c++) t[c] = false;
    for (int c = '0'; c <= '9'; c++) t[c] = true;
    for (int c = 'a'; c <= 'z'; c++) t[c] = true;
    for (int c = 'A'; c <= 'Z'; c++) t[c] = true;
    const char* s = "!#$%&'*+-.^_`|~";
    for (int i = 0; s[i] != 0; i++) t[static_cast<unsigned char>(s[i])] = true;
  }
};
inline constexpr TcharTable kTchar{};

inline bool Tchar(unsigned char c) { return kTchar.t[c]; }
using h1::detail::ForEachToken;  // the list, case and OWS helpers of the response parser
using h1::detail::IEq;
using h1::detail::Lower;
using h1::detail::Ows;
// A byte allowed in a field value (HTAB, SP, VCHAR, obs-text).
inline bool ValueByte(unsigned char c) { return c == '\t' || (c >= 0x20 && c != 0x7f); }
// A byte allowed in a request target (no CTL, SP or DEL; >= 0x80 kept).
inline bool TargetByte(unsigned char c) { return c > 0x20 && c != 0x7f; }

}  // namespace detail

// Feed it the head buffer as it grows (the same bytes, more of them each call); it resumes where it
// stopped. After Done, head() describes the request and head().head_len bytes were the head; after
// Fail, status() is the answer (400, 417, 431, 501 or 505). Reset() before the next request.
class RequestParser {
 public:
  explicit RequestParser(Limits limits = Limits()) : limits_(limits) {
    if (limits_.max_lines > kMaxFields) limits_.max_lines = kMaxFields;
    Reset();
  }

  void Reset() {
    st_ = St::Leading;
    pos_ = 0;
    line_at_ = 0;
    mark_ = 0;
    colon_ = 0;
    leading_ = 0;
    status_ = 0;
    host_count_ = 0;
    te_lines_ = 0;
    conn_close_ = false;
    conn_keep_ = false;
    te_unknown_ = false;
    te_bad_ = false;
    h_.method = Span();
    h_.target = Span();
    h_.form = TargetForm::Origin;
    h_.minor = 1;
    h_.length = -1;
    h_.chunked = false;
    h_.keep_alive = true;
    h_.expect_continue = false;
    h_.head_len = 0;
    h_.field_count = 0;
  }

  const RequestHead& head() const { return h_; }
  int status() const { return status_; }
  // True once any byte of a request line was seen (a timeout then answers 408; before, it just closes).
  bool begun() const { return st_ != St::Leading && st_ != St::LeadingLF; }

  Result Feed(const char* buf, size_t n) {
    if (status_ != 0) return Result::Fail;
    const size_t limit = n < limits_.max_head ? n : limits_.max_head;
    size_t i = pos_;
    for (; i < limit; i++) {
      const unsigned char c = static_cast<unsigned char>(buf[i]);
      switch (st_) {
        case St::Leading:
          if (c == '\r') {
            st_ = St::LeadingLF;
          } else {
            line_at_ = static_cast<uint32_t>(i);
            mark_ = static_cast<uint32_t>(i);
            st_ = St::Method;
            if (!detail::Tchar(c)) return Fail(i, 400);
          }
          break;
        case St::LeadingLF:
          if (c != '\n' || ++leading_ > kMaxLeadingEmpty) return Fail(i, 400);
          st_ = St::Leading;
          break;
        case St::Method:
          if (c == ' ') {
            h_.method = SpanOf(mark_, i);
            mark_ = static_cast<uint32_t>(i + 1);
            st_ = St::Target;
          } else if (!detail::Tchar(c)) {
            return Fail(i, 400);
          }
          break;
        case St::Target:
          if (c == ' ') {
            if (i == mark_) return Fail(i, 400);
            h_.target = SpanOf(mark_, i);
            mark_ = static_cast<uint32_t>(i + 1);
            st_ = St::Version;
          } else if (!detail::TargetByte(c)) {
            return Fail(i, 400);
          }
          break;
        case St::Version: {
          // "HTTP/" DIGIT "." DIGIT, then CR
          const size_t k = i - mark_;
          if (k < 5) {
            if (static_cast<char>(c) != "HTTP/"[k]) return Fail(i, 400);
          } else if (k == 5 || k == 7) {
            if (c < '0' || c > '9') return Fail(i, 400);
          } else if (k == 6) {
            if (c != '.') return Fail(i, 400);
          } else if (c != '\r') {
            return Fail(i, 400);
          } else {
            const char major = buf[mark_ + 5], minor = buf[mark_ + 7];
            if (major != '1') return Fail(i, 505);
            h_.minor = minor == '0' ? 0 : 1;
            if (!ClassifyTarget(buf)) return Fail(i, 400);
            st_ = St::LineLF;
          }
          break;
        }
        case St::LineLF:
          if (c != '\n') return Fail(i, 400);
          line_at_ = static_cast<uint32_t>(i + 1);
          st_ = St::LineStart;
          break;
        case St::LineStart:
          if (c == '\r') {
            st_ = St::FinalLF;
          } else if (!detail::Tchar(c)) {
            return Fail(i, 400);  // obs-fold, whitespace, a colon with no name, a control byte
          } else {
            if (h_.field_count >= limits_.max_lines) return Fail(i, 431);
            mark_ = static_cast<uint32_t>(i);
            st_ = St::Name;
          }
          break;
        case St::Name:
          if (c == ':') {
            colon_ = static_cast<uint32_t>(i);
            mark_ = static_cast<uint32_t>(i + 1);
            st_ = St::Value;
          } else if (!detail::Tchar(c)) {
            return Fail(i, 400);
          }
          break;
        case St::Value:
          if (c == '\r') {
            st_ = St::ValueLF;
          } else if (!detail::ValueByte(c)) {
            return Fail(i, 400);
          }
          break;
        case St::ValueLF: {
          if (c != '\n') return Fail(i, 400);
          const int s = EndField(buf, i - 1);
          if (s != 0) return Fail(i, s);
          line_at_ = static_cast<uint32_t>(i + 1);
          st_ = St::LineStart;
          break;
        }
        case St::FinalLF: {
          if (c != '\n') return Fail(i, 400);
          const int s = EndHead();
          if (s != 0) return Fail(i, s);
          h_.head_len = static_cast<uint32_t>(i + 1);
          pos_ = i + 1;
          st_ = St::Done;
          return Result::Done;
        }
        case St::Done:
          return Result::Done;
      }
    }
    pos_ = i;
    if (n >= limits_.max_head) return Fail(i, 431);  // no end of head within the bound
    return Result::More;
  }

 private:
  enum class St : uint8_t { Leading, LeadingLF, Method, Target, Version, LineLF, LineStart, Name, Value, ValueLF, FinalLF, Done };

  Result Fail(size_t at, int status) {
    pos_ = at;
    status_ = status;
    return Result::Fail;
  }

  static Span SpanOf(size_t a, size_t b) { return Span{static_cast<uint32_t>(a), static_cast<uint32_t>(b - a)}; }

  bool ClassifyTarget(const char* buf) {
    const char* t = buf + h_.target.at;
    const size_t n = h_.target.len;
    const bool connect = h_.method.len == 7 && memcmp(buf + h_.method.at, "CONNECT", 7) == 0;
    if (t[0] == '/') {
      h_.form = TargetForm::Origin;
      return !connect;
    }
    if (n == 1 && t[0] == '*') {
      h_.form = TargetForm::Asterisk;
      return h_.method.len == 7 && memcmp(buf + h_.method.at, "OPTIONS", 7) == 0;
    }
    if (connect) {
      h_.form = TargetForm::Authority;
      return true;
    }
    // absolute-form: scheme ":" ... (RFC 9112 3.2.2); a scheme is ALPHA *( ALPHA / DIGIT / "+" / "-" / "." )
    size_t k = 0;
    while (k < n && t[k] != ':') {
      const char ch = t[k];
      const bool alpha = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z');
      if (!(alpha || (k > 0 && ((ch >= '0' && ch <= '9') || ch == '+' || ch == '-' || ch == '.')))) return false;
      k++;
    }
    if (k == 0 || k == n) return false;
    h_.form = TargetForm::Absolute;
    return true;
  }

  // A field line ended at cr (the CR's offset); its name is [line_at_, colon_), its value (colon_, cr).
  // Returns 0 or the status to fail with.
  int EndField(const char* buf, size_t cr) {
    size_t a = colon_ + 1, b = cr;
    while (a < b && detail::Ows(buf[a])) a++;
    while (b > a && detail::Ows(buf[b - 1])) b--;
    Field& f = h_.fields[h_.field_count++];
    f.name = SpanOf(line_at_, colon_);
    f.value = SpanOf(a, b);
    const char* name = buf + f.name.at;
    const char* v = buf + a;
    const size_t vn = b - a;
    switch (f.name.len) {
      case 4:
        if (detail::IEq(name, 4, "host", 4)) host_count_++;
        break;
      case 6:
        if (detail::IEq(name, 6, "expect", 6)) {
          bool other = false;
          detail::ForEachToken(v, vn, [&](const char* tok, size_t tn) {
            if (detail::IEq(tok, tn, "100-continue", 12)) h_.expect_continue = true;
            else other = true;
          });
          if (other) return 417;
        }
        break;
      case 10:
        if (detail::IEq(name, 10, "connection", 10)) {
          detail::ForEachToken(v, vn, [&](const char* tok, size_t tn) {
            if (detail::IEq(tok, tn, "close", 5)) conn_close_ = true;
            else if (detail::IEq(tok, tn, "keep-alive", 10)) conn_keep_ = true;
          });
        }
        break;
      case 14:
        if (detail::IEq(name, 14, "content-length", 14)) {
          if (vn == 0 || vn > 16) return 400;
          uint64_t x = 0;
          for (size_t k = 0; k < vn; k++) {
            if (v[k] < '0' || v[k] > '9') return 400;
            x = x * 10 + static_cast<uint64_t>(v[k] - '0');
          }
          if (x > kMaxSafeInteger) return 400;
          const double d = static_cast<double>(x);
          if (h_.length >= 0 && h_.length != d) return 400;
          h_.length = d;
        }
        break;
      case 17:
        if (detail::IEq(name, 17, "transfer-encoding", 17)) {
          if (++te_lines_ > 1) return 400;
          bool seen_chunked = false, last_chunked = false;
          detail::ForEachToken(v, vn, [&](const char* tok, size_t tn) {
            if (detail::IEq(tok, tn, "chunked", 7)) {
              if (seen_chunked) te_bad_ = true;
              seen_chunked = last_chunked = true;
            } else {
              last_chunked = false;
              bool token = true;
              for (size_t k = 0; k < tn; k++) token = token && detail::Tchar(static_cast<unsigned char>(tok[k]));
              if (!token) te_bad_ = true;
              te_unknown_ = true;
            }
          });
          if (!last_chunked) te_bad_ = true;
          h_.chunked = true;
        }
        break;
      default:
        break;
    }
    return 0;
  }

  int EndHead() {
    if (h_.chunked) {
      if (te_bad_ || h_.length >= 0 || h_.minor == 0) return 400;
      if (te_unknown_) return 501;
    }
    if (h_.minor == 1 ? host_count_ != 1 : host_count_ > 1) return 400;
    h_.keep_alive = h_.minor == 1 ? !conn_close_ : (conn_keep_ && !conn_close_);
    return 0;
  }

  Limits limits_;
  RequestHead h_;
  St st_ = St::Leading;
  size_t pos_ = 0;
  uint32_t line_at_ = 0;
  uint32_t mark_ = 0;
  uint32_t colon_ = 0;
  uint32_t leading_ = 0;
  int status_ = 0;
  uint32_t host_count_ = 0;
  uint32_t te_lines_ = 0;
  bool conn_close_ = false;
  bool conn_keep_ = false;
  bool te_unknown_ = false;
  bool te_bad_ = false;
};

// Decodes a chunked request body in place: Feed(p, n) squeezes the framing bytes out of p and
// returns the decoded length in *out (the data is p[0, *out)); Done once the last chunk and its
// trailers were read (consumed() bytes of this p were the body's, the rest is the next request),
// Fail on any framing error (answer 400).
class ChunkedDecoder {
 public:
  void Reset() {
    st_ = St::Size;
    digits_ = 0;
    size_ = 0;
    remaining_ = 0;
    ext_len_ = 0;
    trailer_bytes_ = 0;
    consumed_ = 0;
    decoded_ = 0;
  }

  size_t consumed() const { return consumed_; }
  uint64_t decoded() const { return decoded_; }  // body bytes so far, over every Feed

  Result Feed(char* p, size_t n, size_t* out) {
    size_t w = 0, i = 0;
    Result r = Result::More;
    while (i < n && r == Result::More) {
      const unsigned char c = static_cast<unsigned char>(p[i]);
      switch (st_) {
        case St::Size: {
          int d = Hex(c);
          if (d >= 0) {
            if (++digits_ > kMaxChunkDigits) r = Result::Fail;
            else size_ = size_ * 16 + static_cast<uint64_t>(d);
          } else if (digits_ == 0) {
            r = Result::Fail;
          } else if (c == ';') {
            st_ = St::Ext;
          } else if (c == ' ' || c == '\t') {
            st_ = St::Bws;
          } else if (c == '\r') {
            st_ = St::SizeLF;
          } else {
            r = Result::Fail;
          }
          i++;
          break;
        }
        case St::Bws:
          if (c == ';') st_ = St::Ext;
          else if (c != ' ' && c != '\t') r = Result::Fail;
          i++;
          break;
        case St::Ext:
          if (c == '\r') st_ = St::SizeLF;
          else if (!detail::ValueByte(c) || ++ext_len_ > kMaxChunkExt) r = Result::Fail;
          i++;
          break;
        case St::SizeLF:
          if (c != '\n') {
            r = Result::Fail;
          } else if (size_ == 0) {
            st_ = St::TrailerStart;
          } else {
            remaining_ = size_;
            st_ = St::Data;
          }
          i++;
          break;
        case St::Data: {
          size_t k = n - i;
          if (k > remaining_) k = static_cast<size_t>(remaining_);
          if (w != i) memmove(p + w, p + i, k);
          w += k;
          i += k;
          remaining_ -= k;
          decoded_ += k;
          if (remaining_ == 0) st_ = St::DataCR;
          break;
        }
        case St::DataCR:
          if (c != '\r') r = Result::Fail;
          else st_ = St::DataLF;
          i++;
          break;
        case St::DataLF:
          if (c != '\n') {
            r = Result::Fail;
          } else {
            st_ = St::Size;
            digits_ = 0;
            size_ = 0;
            ext_len_ = 0;
          }
          i++;
          break;
        case St::TrailerStart:
          if (++trailer_bytes_ > kMaxTrailers) r = Result::Fail;
          else if (c == '\r') st_ = St::FinalLF;
          else if (!detail::Tchar(c)) r = Result::Fail;
          else st_ = St::Trailer;
          i++;
          break;
        case St::Trailer:
          if (++trailer_bytes_ > kMaxTrailers) r = Result::Fail;
          else if (c == '\r') st_ = St::TrailerLF;
          else if (!detail::ValueByte(c) && c != ':') r = Result::Fail;
          i++;
          break;
        case St::TrailerLF:
          if (c != '\n') r = Result::Fail;
          else st_ = St::TrailerStart;
          i++;
          break;
        case St::FinalLF:
          if (c != '\n') r = Result::Fail;
          else r = Result::Done;
          i++;
          break;
      }
    }
    *out = w;
    consumed_ = i;
    return r;
  }

 private:
  enum class St : uint8_t { Size, Bws, Ext, SizeLF, Data, DataCR, DataLF, TrailerStart, Trailer, TrailerLF, FinalLF };
  static int Hex(unsigned char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
  St st_ = St::Size;
  int digits_ = 0;
  uint64_t size_ = 0;
  uint64_t remaining_ = 0;
  uint32_t ext_len_ = 0;
  size_t trailer_bytes_ = 0;
  size_t consumed_ = 0;
  uint64_t decoded_ = 0;
};

}  // namespace h1req
}  // namespace switchyard
