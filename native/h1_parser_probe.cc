// A test-only entry point over the HTTP/1.1 response parser (h1_parser.h):
// h1ParseForTest(bytes, splits, eof) feeds bytes to one parser in the pieces
// splits names (end offsets) and reports what it saw. Used by
// test/native-h1-parser.property.test.ts against the TS reference model; not on any
// request path (it builds a JS object per call).
#include "h1_parser_probe.h"

#include <cstring>
#include <string>
#include <vector>

#include "h1_parser.h"

namespace switchyard {
namespace {

struct ProbeSink {
  int heads = 0;
  int status = 0;
  double length = -1;
  std::string type;
  std::string body;
  void OnHead(const h1::Head& h) {
    heads++;
    status = h.status;
    length = h.length;
    type.assign(h.type == nullptr ? "" : h.type, h.type_len);
  }
  void OnBody(char* p, size_t n) { body.append(p, n); }
};

// h1ParseForTest(bytes: Uint8Array, splits: Uint32Array, eof: boolean)
//   -> { outcome: 'done'|'fail'|'more'|'eof', error, heads, status, type, length, keepAlive, consumed, body: Buffer }
Napi::Value ParseForTest(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 3 || !info[0].IsTypedArray() || info[0].As<Napi::TypedArray>().TypedArrayType() != napi_uint8_array) {
    Napi::TypeError::New(env, "bytes must be a Uint8Array").ThrowAsJavaScriptException();
    return env.Undefined();
  }
  if (!info[1].IsTypedArray() || info[1].As<Napi::TypedArray>().TypedArrayType() != napi_uint32_array) {
    Napi::TypeError::New(env, "splits must be a Uint32Array").ThrowAsJavaScriptException();
    return env.Undefined();
  }
  if (!info[2].IsBoolean()) {
    Napi::TypeError::New(env, "eof must be a boolean").ThrowAsJavaScriptException();
    return env.Undefined();
  }
  Napi::Uint8Array bytes = info[0].As<Napi::Uint8Array>();
  Napi::Uint32Array splits = info[1].As<Napi::Uint32Array>();
  const size_t n = bytes.ByteLength();
  std::vector<size_t> ends;
  size_t prev = 0;
  for (size_t k = 0; k < splits.ElementLength(); k++) {
    const size_t e = splits[k];
    if (e <= prev || e >= n) {
      Napi::RangeError::New(env, "splits must be increasing offsets inside bytes").ThrowAsJavaScriptException();
      return env.Undefined();
    }
    ends.push_back(e);
    prev = e;
  }
  ends.push_back(n);
  h1::ResponseParser parser;
  ProbeSink sink;
  parser.Start();
  const char* outcome = "more";
  double consumed = 0;
  size_t at = 0;
  std::vector<char> piece;  // each read in a buffer of its own (the parser writes into it), as a socket read would be
  for (size_t e : ends) {
    if (at == e) continue;
    piece.assign(reinterpret_cast<const char*>(bytes.Data()) + at, reinterpret_cast<const char*>(bytes.Data()) + e);
    const h1::Result r = parser.Feed(piece.data(), piece.size(), sink);
    if (r == h1::Result::Done) {
      outcome = "done";
      consumed = static_cast<double>(at + parser.consumed());
      break;
    }
    if (r == h1::Result::Fail) {
      outcome = "fail";
      break;
    }
    at = e;
  }
  if (strcmp(outcome, "more") == 0 && info[2].As<Napi::Boolean>().Value() && parser.Eof()) {
    outcome = "eof";
    consumed = static_cast<double>(n);
  }
  Napi::Object o = Napi::Object::New(env);
  o.Set("outcome", outcome);
  o.Set("error", static_cast<double>(static_cast<int32_t>(parser.error())));
  o.Set("heads", sink.heads);
  o.Set("status", sink.status);
  napi_value type;  // one char per byte, as the client's contentType()
  napi_create_string_latin1(env, sink.type.data(), sink.type.size(), &type);
  o.Set("type", Napi::Value(env, type));
  o.Set("length", sink.length);
  o.Set("keepAlive", parser.keep_alive());
  o.Set("consumed", consumed);
  o.Set("body", Napi::Buffer<char>::Copy(env, sink.body.data(), sink.body.size()));
  return o;
}

}  // namespace

void InitH1ParserProbe(Napi::Env env, Napi::Object exports) {
  exports.Set("h1ParseForTest", Napi::Function::New<ParseForTest>(env, "h1ParseForTest"));
}

}  // namespace switchyard
