// A test-only entry point over the strict HTTP/1.1 request parser
// (h1_request_parser.h): h1RequestParseForTest(bytes, splits, maxHead,
// maxLines) feeds bytes to one parser as a growing head buffer, in the pieces
// splits names (end offsets), then decodes the body (Content-Length or
// chunked, in the same pieces) and reports what it saw. Used by
// test/native-h1-request-parser.test.ts; not on any request path (it builds
// a JS object per call).
#include "h1_request_probe.h"

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "h1_request_parser.h"

namespace switchyard {
namespace {

napi_value Latin1(Napi::Env env, const char* p, size_t n) {
  napi_value v;
  napi_create_string_latin1(env, p, n, &v);
  return v;
}

// -> { outcome: 'done'|'fail'|'more', status, method, target, form, minor, length, chunked, keepAlive,
//      expectContinue, begun, headLen, fields: [name, value][], body: Buffer|null, bodyOutcome, consumed }
Napi::Value ParseForTest(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 4 || !info[0].IsTypedArray() || info[0].As<Napi::TypedArray>().TypedArrayType() != napi_uint8_array ||
      !info[1].IsTypedArray() || info[1].As<Napi::TypedArray>().TypedArrayType() != napi_uint32_array || !info[2].IsNumber() ||
      !info[3].IsNumber()) {
    Napi::TypeError::New(env, "h1RequestParseForTest(bytes: Uint8Array, splits: Uint32Array, maxHead: number, maxLines: number)")
        .ThrowAsJavaScriptException();
    return env.Undefined();
  }
  Napi::Uint8Array bytes = info[0].As<Napi::Uint8Array>();
  Napi::Uint32Array splits = info[1].As<Napi::Uint32Array>();
  const size_t n = bytes.ByteLength();
  const char* all = reinterpret_cast<const char*>(bytes.Data());
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
  h1req::Limits limits;
  limits.max_head = static_cast<size_t>(info[2].As<Napi::Number>().Int64Value());
  limits.max_lines = static_cast<uint32_t>(info[3].As<Napi::Number>().Uint32Value());
  auto parser = std::make_unique<h1req::RequestParser>(limits);
  std::string head;  // the growing head buffer, as a connection keeps it
  const char* outcome = "more";
  size_t piece = 0;
  size_t body_at = 0;
  for (; piece < ends.size(); piece++) {
    head.assign(all, ends[piece]);
    const h1req::Result r = parser->Feed(head.data(), head.size());
    if (r == h1req::Result::Fail) {
      outcome = "fail";
      break;
    }
    if (r == h1req::Result::Done) {
      outcome = "done";
      body_at = parser->head().head_len;
      break;
    }
  }
  const h1req::RequestHead& h = parser->head();
  Napi::Object o = Napi::Object::New(env);
  o.Set("outcome", outcome);
  o.Set("status", parser->status());
  o.Set("begun", parser->begun());
  if (strcmp(outcome, "done") == 0) {
    o.Set("method", Napi::Value(env, Latin1(env, all + h.method.at, h.method.len)));
    o.Set("target", Napi::Value(env, Latin1(env, all + h.target.at, h.target.len)));
    static const char* kForms[] = {"origin", "absolute", "authority", "asterisk"};
    o.Set("form", kForms[static_cast<int>(h.form)]);
    o.Set("minor", h.minor);
    o.Set("length", h.length);
    o.Set("chunked", h.chunked);
    o.Set("keepAlive", h.keep_alive);
    o.Set("expectContinue", h.expect_continue);
    o.Set("headLen", static_cast<double>(h.head_len));
    Napi::Array fields = Napi::Array::New(env, h.field_count);
    for (uint32_t k = 0; k < h.field_count; k++) {
      Napi::Array pair = Napi::Array::New(env, 2);
      pair.Set(0u, Napi::Value(env, Latin1(env, all + h.fields[k].name.at, h.fields[k].name.len)));
      pair.Set(1u, Napi::Value(env, Latin1(env, all + h.fields[k].value.at, h.fields[k].value.len)));
      fields.Set(k, pair);
    }
    o.Set("fields", fields);
    // the body, in the remaining pieces (the rest of the head's piece first)
    std::string body;
    const char* body_outcome = "more";
    size_t consumed = body_at;
    if (h.chunked) {
      h1req::ChunkedDecoder dec;
      dec.Reset();
      std::vector<char> buf;
      size_t at = body_at;
      for (size_t k = piece; k < ends.size(); k++) {
        if (ends[k] <= at) continue;
        buf.assign(all + at, all + ends[k]);
        size_t out = 0;
        const h1req::Result r = dec.Feed(buf.data(), buf.size(), &out);
        body.append(buf.data(), out);
        if (r == h1req::Result::Fail) {
          body_outcome = "fail";
          break;
        }
        if (r == h1req::Result::Done) {
          body_outcome = "done";
          consumed = at + dec.consumed();
          break;
        }
        at = ends[k];
      }
    } else {
      const size_t want = h.length < 0 ? 0 : static_cast<size_t>(h.length);
      if (n - body_at >= want) {
        body.assign(all + body_at, want);
        body_outcome = "done";
        consumed = body_at + want;
      }
    }
    o.Set("bodyOutcome", body_outcome);
    o.Set("body", Napi::Buffer<char>::Copy(env, body.data(), body.size()));
    o.Set("consumed", static_cast<double>(consumed));
  }
  return o;
}

}  // namespace

void InitH1RequestProbe(Napi::Env env, Napi::Object exports) {
  exports.Set("h1RequestParseForTest", Napi::Function::New<ParseForTest>(env, "h1RequestParseForTest"));
}

}  // namespace switchyard
