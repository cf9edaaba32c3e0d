// The request-body scanner (issue 37, "scan, don't parse"): one pass over an
// inference request body's bytes that validates it as JSON (RFC 8259, the
// grammar JSON.parse accepts) with the router's nesting bound, lists its
// top-level members (key and value byte ranges) and renders the prompt the
// prefix index matches on, exactly as src/director/prompt.ts renders it from
// the parsed object: chat, each message as role, '\n', text content (a string,
// or the `text` / `image_url.url` of each content part), '\n'; completions,
// the prompt string (or the first of a batch) or its token ids as
// little-endian uint32s. JSON escapes are decoded on the fly and the bytes are
// decoded as Node's Buffer#toString('utf8') decodes them (an invalid UTF-8
// sequence becomes U+FFFD, maximal subparts as the WHATWG decoder does), then
// written as Buffer#write(s, 'utf8') writes a JavaScript string (a lone
// surrogate from a \u escape becomes U+FFFD): the same bytes, so the same
// block hashes.
//
// No N-API and no allocation beyond the container stack (a vector kept by the
// caller): body_scan.cc is the bridge. Anything the scanner is not sure it
// renders exactly as JavaScript would (invalid JSON, a semantic error, a
// number out of double range among token ids, too many members) is answered
// kFallback: the caller then runs the JavaScript parse, which gives today's
// exact answer and error message. The scanner never reads outside
// [body, body + size).
#pragma once

#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace switchyard {
namespace bodyscan {

enum Status : int { kOk = 0, kFallback = 1, kOutTooSmall = 2 };

enum Type : uint8_t { kNone = 0, kString = 1, kNumber = 2, kTrue = 3, kFalse = 4, kNull = 5, kObject = 6, kArray = 7 };
// flags above the type (a member's fifth int)
constexpr int kKeyEscaped = 8;      // the key has a backslash: decode it with JSON.parse
constexpr int kValueEscaped = 16;   // a string value has a backslash
constexpr int kIncludeUsage = 32;   // stream_options: its (last) include_usage is the literal true

// request kinds (src/director/kinds.ts)
constexpr int kKindChat = 0;
constexpr int kKindCompletion = 1;

/** Most top-level members listed (a body with more falls back to the JavaScript parse). */
constexpr int kMaxMembers = 256;
constexpr int kMemberInts = 5;
/** meta: [prompt length or bytes needed, member count, members × (keyBegin, keyEnd, valueBegin, valueEnd, type|flags)] */
constexpr int kMetaInts = 2 + kMaxMembers * kMemberInts;

/** Where rendered bytes go: writes past `cap` are counted, not stored (the caller grows and scans again). */
struct Out {
  uint8_t* p;
  size_t cap;
  size_t len = 0;
  inline void put(const uint8_t* s, size_t n) {
    if (len + n <= cap && n != 0) std::memcpy(p + len, s, n);
    len += n;
  }
  inline void byte(uint8_t b) {
    if (len < cap) p[len] = b;
    len++;
  }
};

struct Range {
  size_t begin = 0;  // the value's first byte
  size_t end = 0;    // one past its last
  uint8_t type = kNone;
};

class Scanner {
 public:
  /** A long string's extent, noted while validating so the render never walks it again to skip it. */
  struct Span {
    uint32_t begin;  // its opening quote
    uint32_t end;    // one past its closing quote
  };

  Scanner(const uint8_t* b, size_t n, int max_depth, std::vector<uint8_t>& stack, std::vector<Span>& spans)
      : b_(b), n_(n), max_depth_(max_depth), stack_(stack), spans_(spans) {
    spans_.clear();
  }

  /**
   * Scans the whole body. `meta` has kMetaInts ints. Returns kOk (meta[0] =
   * prompt length, bytes in out.p[0, len)), kOutTooSmall (meta[0] = bytes
   * needed) or kFallback.
   */
  int Scan(int kind, Out& out, int32_t* meta) {
    if (n_ > 0x7fffffff) return kFallback;
    size_t i = 0;
    Ws(i);
    if (i >= n_ || b_[i] != '{') return kFallback;  // not an object (or invalid): JavaScript says which
    if (1 > max_depth_) return kFallback;
    i++;
    Range messages, prompt;
    int count = 0;
    Ws(i);
    if (i < n_ && b_[i] == '}') {
      i++;
    } else {
      for (;;) {
        Ws(i);
        if (i >= n_ || b_[i] != '"') return kFallback;
        size_t kb = i + 1;
        bool kesc = false;
        if (!SkipString(i, &kesc)) return kFallback;
        size_t ke = i - 1;
        Ws(i);
        if (i >= n_ || b_[i] != ':') return kFallback;
        i++;
        Ws(i);
        if (i >= n_) return kFallback;
        size_t vb = i;
        uint8_t type;
        bool vesc = false;
        uint8_t c = b_[i];
        if (c == '"') {
          type = kString;
          if (!SkipString(i, &vesc)) return kFallback;
        } else if (c == '{' || c == '[') {
          type = c == '{' ? kObject : kArray;
          if (!SkipValue(i, 1)) return kFallback;
        } else {
          if (!SkipScalar(i, &type)) return kFallback;
        }
        size_t ve = i;
        if (count == kMaxMembers) return kFallback;
        int flags = type | (kesc ? kKeyEscaped : 0) | (vesc ? kValueEscaped : 0);
        if (KeyIs(kb, ke, kesc, "messages", 8)) messages = Range{vb, ve, type};
        else if (KeyIs(kb, ke, kesc, "prompt", 6)) prompt = Range{vb, ve, type};
        else if (type == kObject && KeyIs(kb, ke, kesc, "stream_options", 14) && IncludeUsage(vb)) flags |= kIncludeUsage;
        int32_t* m = meta + 2 + count * kMemberInts;
        m[0] = static_cast<int32_t>(kb);
        m[1] = static_cast<int32_t>(ke);
        m[2] = static_cast<int32_t>(vb);
        m[3] = static_cast<int32_t>(ve);
        m[4] = flags;
        count++;
        Ws(i);
        if (i >= n_) return kFallback;
        if (b_[i] == ',') {
          i++;
          continue;
        }
        if (b_[i] == '}') {
          i++;
          break;
        }
        return kFallback;
      }
    }
    Ws(i);
    if (i != n_) return kFallback;  // bytes after the object
    meta[1] = count;
    rendering_ = true;
    bool ok = true;
    if (kind == kKindChat) ok = RenderChat(messages, out);
    else if (kind == kKindCompletion) ok = RenderCompletion(prompt, out);
    if (!ok) return kFallback;
    if (out.len > out.cap) {
      if (out.len > 0x7fffffff) return kFallback;
      meta[0] = static_cast<int32_t>(out.len);
      return kOutTooSmall;
    }
    meta[0] = static_cast<int32_t>(out.len);
    return kOk;
  }

 private:
  const uint8_t* b_;
  size_t n_;
  int max_depth_;
  std::vector<uint8_t>& stack_;
  std::vector<Span>& spans_;  // sorted by begin: strings are validated in order
  bool rendering_ = false;    // validated: skipping a long string is a lookup

  static constexpr size_t kLongString = 128;

  // the end of the long string whose quote is at i, if the validation noted it
  inline bool Jump(size_t& i) const {
    size_t lo = 0, hi = spans_.size();
    while (lo < hi) {
      size_t mid = (lo + hi) / 2;
      if (spans_[mid].begin < i) lo = mid + 1;
      else hi = mid;
    }
    if (lo < spans_.size() && spans_[lo].begin == i) {
      i = spans_[lo].end;
      return true;
    }
    return false;
  }

  static inline bool Digit(uint8_t c) { return c >= '0' && c <= '9'; }

  inline void Ws(size_t& i) const {
    while (i < n_) {
      uint8_t c = b_[i];
      if (c != ' ' && c != '\n' && c != '\r' && c != '\t') return;
      i++;
    }
  }

  // first byte at or after i that is '"', '\\' or a control character (< 0x20)
  inline size_t FindStringSpecial(size_t i) const {
#if defined(__SSE2__)
    const __m128i q = _mm_set1_epi8('"');
    const __m128i bs = _mm_set1_epi8('\\');
    const __m128i c1f = _mm_set1_epi8(0x1f);
    while (i + 16 <= n_) {
      __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b_ + i));
      __m128i ctl = _mm_cmpeq_epi8(_mm_min_epu8(v, c1f), v);  // v <= 0x1f, unsigned
      __m128i m = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, q), _mm_cmpeq_epi8(v, bs)), ctl);
      int mask = _mm_movemask_epi8(m);
      if (mask != 0) return i + static_cast<size_t>(__builtin_ctz(static_cast<unsigned>(mask)));
      i += 16;
    }
#endif
    while (i < n_) {
      uint8_t c = b_[i];
      if (c == '"' || c == '\\' || c < 0x20) return i;
      i++;
    }
    return n_;
  }

  // first byte at or after i that is '"', '\\', a control character or >= 0x80
  inline size_t FindRenderSpecial(size_t i, size_t end) const {
#if defined(__SSE2__)
    const __m128i q = _mm_set1_epi8('"');
    const __m128i bs = _mm_set1_epi8('\\');
    const __m128i sp = _mm_set1_epi8(0x20);
    while (i + 16 <= end) {
      __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b_ + i));
      // signed: bytes >= 0x80 are negative, so one compare finds them and the controls
      __m128i m = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, q), _mm_cmpeq_epi8(v, bs)), _mm_cmplt_epi8(v, sp));
      int mask = _mm_movemask_epi8(m);
      if (mask != 0) return i + static_cast<size_t>(__builtin_ctz(static_cast<unsigned>(mask)));
      i += 16;
    }
#endif
    while (i < end) {
      uint8_t c = b_[i];
      if (c == '"' || c == '\\' || c < 0x20 || c >= 0x80) return i;
      i++;
    }
    return end;
  }

  static inline int Hex(uint8_t c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }

  // i at the opening quote; after: one past the closing quote. Bytes >= 0x80 are
  // not checked here: JavaScript decodes an invalid sequence to U+FFFD, which a
  // JSON string may hold.
  bool SkipString(size_t& i, bool* escaped) {
    if (rendering_ && escaped == nullptr && !spans_.empty() && Jump(i)) return true;
    size_t begin = i;
    i++;
    for (;;) {
      i = FindStringSpecial(i);
      if (i >= n_) return false;
      uint8_t c = b_[i];
      if (c == '"') {
        i++;
        if (!rendering_ && i - begin >= kLongString) spans_.push_back(Span{static_cast<uint32_t>(begin), static_cast<uint32_t>(i)});
        return true;
      }
      if (c < 0x20) return false;
      // a backslash
      if (escaped != nullptr) *escaped = true;
      if (i + 1 >= n_) return false;
      uint8_t e = b_[i + 1];
      if (e == 'u') {
        if (i + 6 > n_) return false;
        for (size_t k = 2; k < 6; k++)
          if (Hex(b_[i + k]) < 0) return false;
        i += 6;
      } else if (e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' || e == 'n' || e == 'r' || e == 't') {
        i += 2;
      } else {
        return false;
      }
    }
  }

  bool SkipNumber(size_t& i) const {
    if (b_[i] == '-') i++;
    if (i >= n_) return false;
    if (b_[i] == '0') i++;
    else if (b_[i] >= '1' && b_[i] <= '9') {
      while (i < n_ && Digit(b_[i])) i++;
    } else {
      return false;
    }
    if (i < n_ && b_[i] == '.') {
      i++;
      if (i >= n_ || !Digit(b_[i])) return false;
      while (i < n_ && Digit(b_[i])) i++;
    }
    if (i < n_ && (b_[i] == 'e' || b_[i] == 'E')) {
      i++;
      if (i < n_ && (b_[i] == '+' || b_[i] == '-')) i++;
      if (i >= n_ || !Digit(b_[i])) return false;
      while (i < n_ && Digit(b_[i])) i++;
    }
    return true;
  }

  bool Literal(size_t& i, const char* word, size_t len) const {
    if (n_ - i < len || std::memcmp(b_ + i, word, len) != 0) return false;
    i += len;
    return true;
  }

  // a number, true, false or null at i
  bool SkipScalar(size_t& i, uint8_t* type) const {
    uint8_t c = b_[i];
    if (c == '-' || Digit(c)) {
      *type = kNumber;
      return SkipNumber(i);
    }
    if (c == 't') {
      *type = kTrue;
      return Literal(i, "true", 4);
    }
    if (c == 'f') {
      *type = kFalse;
      return Literal(i, "false", 5);
    }
    if (c == 'n') {
      *type = kNull;
      return Literal(i, "null", 4);
    }
    return false;
  }

  // One value at i (whitespace before it skipped), nested inside `depth`
  // containers; iterative, its own stack, so no body can exhaust the C stack.
  bool SkipValue(size_t& i, int depth) {
    stack_.clear();
    for (;;) {
      // a value is expected at i
      Ws(i);
      if (i >= n_) return false;
      uint8_t c = b_[i];
      bool closed = false;
      if (c == '{' || c == '[') {
        if (depth + static_cast<int>(stack_.size()) + 1 > max_depth_) return false;
        stack_.push_back(c);
        i++;
        Ws(i);
        if (i >= n_) return false;
        if (c == '{') {
          if (b_[i] == '}') {
            i++;
            stack_.pop_back();
            closed = true;
          } else {
            if (b_[i] != '"' || !SkipString(i, nullptr)) return false;
            Ws(i);
            if (i >= n_ || b_[i] != ':') return false;
            i++;
            continue;
          }
        } else {
          if (b_[i] == ']') {
            i++;
            stack_.pop_back();
            closed = true;
          } else {
            continue;
          }
        }
      } else if (c == '"') {
        if (!SkipString(i, nullptr)) return false;
      } else {
        uint8_t t;
        if (!SkipScalar(i, &t)) return false;
      }
      (void)closed;
      // after a value: close containers, or go on to the next element
      for (;;) {
        if (stack_.empty()) return true;
        Ws(i);
        if (i >= n_) return false;
        uint8_t top = stack_.back();
        uint8_t d = b_[i];
        if (d == ',') {
          i++;
          if (top == '{') {
            Ws(i);
            if (i >= n_ || b_[i] != '"' || !SkipString(i, nullptr)) return false;
            Ws(i);
            if (i >= n_ || b_[i] != ':') return false;
            i++;
          }
          break;  // the next value
        }
        if ((top == '{' && d == '}') || (top == '[' && d == ']')) {
          i++;
          stack_.pop_back();
          continue;
        }
        return false;
      }
    }
  }

  // ---- decoding (on bytes already validated) ----------------------------------

  static inline void Utf8(Out& out, uint32_t cp) {
    uint8_t t[4];
    if (cp < 0x80) {
      out.byte(static_cast<uint8_t>(cp));
    } else if (cp < 0x800) {
      t[0] = static_cast<uint8_t>(0xc0 | (cp >> 6));
      t[1] = static_cast<uint8_t>(0x80 | (cp & 0x3f));
      out.put(t, 2);
    } else if (cp < 0x10000) {
      t[0] = static_cast<uint8_t>(0xe0 | (cp >> 12));
      t[1] = static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3f));
      t[2] = static_cast<uint8_t>(0x80 | (cp & 0x3f));
      out.put(t, 3);
    } else {
      t[0] = static_cast<uint8_t>(0xf0 | (cp >> 18));
      t[1] = static_cast<uint8_t>(0x80 | ((cp >> 12) & 0x3f));
      t[2] = static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3f));
      t[3] = static_cast<uint8_t>(0x80 | (cp & 0x3f));
      out.put(t, 4);
    }
  }

  static inline void Replacement(Out& out) {
    static const uint8_t r[3] = {0xef, 0xbf, 0xbd};
    out.put(r, 3);
  }

  // One UTF-8 sequence starting at i (b_[i] >= 0x80), before `end`: copied when
  // well-formed, else U+FFFD for its maximal subpart (WHATWG), as V8 decodes it.
  inline void Sequence(size_t& i, size_t end, Out& out) const {
    uint8_t c = b_[i];
    size_t need;
    uint8_t lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) need = 1;
    else if (c >= 0xe0 && c <= 0xef) {
      need = 2;
      if (c == 0xe0) lo = 0xa0;
      else if (c == 0xed) hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      need = 3;
      if (c == 0xf0) lo = 0x90;
      else if (c == 0xf4) hi = 0x8f;
    } else {
      Replacement(out);
      i++;
      return;
    }
    size_t k = 1;
    for (; k <= need; k++) {
      if (i + k >= end) break;
      uint8_t d = b_[i + k];
      if (d < lo || d > hi) break;
      lo = 0x80;
      hi = 0xbf;
    }
    if (k > need) {
      out.put(b_ + i, need + 1);
      i += need + 1;
    } else {
      Replacement(out);
      i += k;  // the maximal subpart; the byte that broke it starts again
    }
  }

  // Decodes the string whose opening quote is at i into `out`.
  void DecodeString(size_t i, Out& out) const {
    i++;
    for (;;) {
      size_t j = FindRenderSpecial(i, n_);
      out.put(b_ + i, j - i);
      i = j;
      if (i >= n_) return;  // not reached on a validated body
      uint8_t c = b_[i];
      if (c == '"') return;
      if (c >= 0x80) {
        Sequence(i, n_, out);
        continue;
      }
      if (c != '\\') return;  // a control character: not in a validated body
      uint8_t e = b_[i + 1];
      switch (e) {
        case 'n': out.byte('\n'); i += 2; continue;
        case 't': out.byte('\t'); i += 2; continue;
        case 'r': out.byte('\r'); i += 2; continue;
        case 'b': out.byte('\b'); i += 2; continue;
        case 'f': out.byte('\f'); i += 2; continue;
        case 'u': break;
        default: out.byte(e); i += 2; continue;  // " \ /
      }
      uint32_t cu = Hex4(i + 2);
      i += 6;
      if (cu >= 0xd800 && cu <= 0xdbff) {
        // a high surrogate: a pair with a following \u low surrogate, else alone (U+FFFD)
        if (i + 6 <= n_ && b_[i] == '\\' && b_[i + 1] == 'u') {
          uint32_t lo = Hex4(i + 2);
          if (lo >= 0xdc00 && lo <= 0xdfff) {
            Utf8(out, 0x10000 + ((cu - 0xd800) << 10) + (lo - 0xdc00));
            i += 6;
            continue;
          }
        }
        Replacement(out);
      } else if (cu >= 0xdc00 && cu <= 0xdfff) {
        Replacement(out);
      } else {
        Utf8(out, cu);
      }
    }
  }

  inline uint32_t Hex4(size_t i) const {
    return static_cast<uint32_t>((Hex(b_[i]) << 12) | (Hex(b_[i + 1]) << 8) | (Hex(b_[i + 2]) << 4) | Hex(b_[i + 3]));
  }

  // Is the key whose bytes are [kb, ke) (inside its quotes) `name`?
  bool KeyIs(size_t kb, size_t ke, bool escaped, const char* name, size_t len) const {
    if (!escaped) return ke - kb == len && std::memcmp(b_ + kb, name, len) == 0;
    uint8_t tmp[32];
    Out o{tmp, sizeof tmp};
    DecodeString(kb - 1, o);
    return o.len == len && std::memcmp(tmp, name, len) == 0;
  }

  // ---- walking validated values -------------------------------------------------

  // Calls f(keyBegin, keyEnd, keyEscaped, value) for each member of the object at i.
  template <typename F>
  void Members(size_t i, F&& f) {
    i++;
    Ws(i);
    if (b_[i] == '}') return;
    for (;;) {
      Ws(i);
      size_t kb = i + 1;
      bool kesc = false;
      SkipString(i, &kesc);
      size_t ke = i - 1;
      Ws(i);
      i++;  // ':'
      Ws(i);
      Range v = ValueAt(i);
      f(kb, ke, kesc, v);
      Ws(i);
      if (b_[i] == '}') return;
      i++;  // ','
    }
  }

  // Calls f(value) for each element of the array at i.
  template <typename F>
  void Elements(size_t i, F&& f) {
    i++;
    Ws(i);
    if (b_[i] == ']') return;
    for (;;) {
      Ws(i);
      Range v = ValueAt(i);
      f(v);
      Ws(i);
      if (b_[i] == ']') return;
      i++;  // ','
    }
  }

  // The validated value at i; i moves past it.
  Range ValueAt(size_t& i) {
    Range r;
    r.begin = i;
    uint8_t c = b_[i];
    if (c == '"') {
      r.type = kString;
      SkipString(i, nullptr);
    } else if (c == '{' || c == '[') {
      r.type = c == '{' ? kObject : kArray;
      SkipValue(i, 0);  // already checked against the depth bound
    } else {
      SkipScalar(i, &r.type);
    }
    r.end = i;
    return r;
  }

  bool IncludeUsage(size_t i) {
    uint8_t last = kNone;
    Members(i, [&](size_t kb, size_t ke, bool kesc, const Range& v) {
      if (KeyIs(kb, ke, kesc, "include_usage", 13)) last = v.type;
    });
    return last == kTrue;
  }

  // src/director/prompt.ts PromptWriter.chat
  bool RenderChat(const Range& messages, Out& out) {
    if (messages.type != kArray) return false;
    bool ok = true;
    bool any = false;
    Elements(messages.begin, [&](const Range& m) {
      any = true;
      if (!ok) return;
      if (m.type == kArray) {  // typeof [] === 'object': no role, no content
        out.byte('\n');
        out.byte('\n');
        return;
      }
      if (m.type != kObject) {
        ok = false;
        return;
      }
      Range role, content;
      Members(m.begin, [&](size_t kb, size_t ke, bool kesc, const Range& v) {
        if (KeyIs(kb, ke, kesc, "role", 4)) role = v;
        else if (KeyIs(kb, ke, kesc, "content", 7)) content = v;
      });
      if (role.type == kString) DecodeString(role.begin, out);
      out.byte('\n');
      if (content.type == kString) {
        DecodeString(content.begin, out);
      } else if (content.type == kArray) {
        Elements(content.begin, [&](const Range& part) {
          if (part.type != kObject) return;
          Range text, image;
          Members(part.begin, [&](size_t kb, size_t ke, bool kesc, const Range& v) {
            if (KeyIs(kb, ke, kesc, "text", 4)) text = v;
            else if (KeyIs(kb, ke, kesc, "image_url", 9)) image = v;
          });
          if (text.type == kString) {
            DecodeString(text.begin, out);
          } else if (image.type == kObject) {
            Range url;
            Members(image.begin, [&](size_t kb, size_t ke, bool kesc, const Range& v) {
              if (KeyIs(kb, ke, kesc, "url", 3)) url = v;
            });
            if (url.type == kString) DecodeString(url.begin, out);
          }
        });
      }
      out.byte('\n');
    });
    return ok && any;
  }

  // A token id: a non-negative integer (JavaScript's Number.isInteger), written as
  // ToUint32 of it. False for anything else, and for a number strtod-style parsing
  // calls out of range (JavaScript's answer, Infinity or 0, is left to it).
  bool TokenId(const Range& v, Out& out) const {
    if (v.type != kNumber) return false;
    double d;
    auto r = std::from_chars(reinterpret_cast<const char*>(b_ + v.begin), reinterpret_cast<const char*>(b_ + v.end), d);
    if (r.ec != std::errc() || r.ptr != reinterpret_cast<const char*>(b_ + v.end)) return false;
    if (!std::isfinite(d) || d < 0 || std::trunc(d) != d) return false;
    uint32_t u = d < 4294967296.0 ? static_cast<uint32_t>(d) : static_cast<uint32_t>(std::fmod(d, 4294967296.0));
    uint8_t t[4] = {static_cast<uint8_t>(u), static_cast<uint8_t>(u >> 8), static_cast<uint8_t>(u >> 16), static_cast<uint8_t>(u >> 24)};
    out.put(t, 4);
    return true;
  }

  // src/director/prompt.ts PromptWriter.completion
  bool RenderCompletion(const Range& prompt, Out& out) {
    if (prompt.type == kString) {
      DecodeString(prompt.begin, out);
      return true;
    }
    if (prompt.type != kArray) return false;
    Range first;
    size_t i = prompt.begin + 1;
    Ws(i);
    if (b_[i] == ']') return false;  // empty
    first = ValueAt(i);
    if (first.type == kString) {
      DecodeString(first.begin, out);
      return true;
    }
    const Range& ids = first.type == kArray ? first : prompt;
    bool ok = true;
    Elements(ids.begin, [&](const Range& v) {
      if (ok && !TokenId(v, out)) ok = false;
    });
    return ok;
  }
};

}  // namespace bodyscan
}  // namespace switchyard
