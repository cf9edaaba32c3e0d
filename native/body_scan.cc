// The N-API bridge of the request-body scanner (body_scan.h):
//   scanRequestBody(body: Uint8Array, kind: number, maxDepth: number,
//                   out: Uint8Array, meta: Int32Array) -> 0 | 1 | 2
// 0: valid and rendered (meta[0] = prompt bytes in out, meta[1] = members,
// then 5 ints per member); 1: fall back to the JavaScript parse (invalid JSON,
// too deep, a semantic error: it gives the exact answer); 2: out too small
// (meta[0] = bytes needed: grow it and call again). One call per body; no
// allocation once the container stack has grown to the deepest body seen.
#include "body_scan.h"

#include <napi.h>

#include <vector>

namespace switchyard {
namespace {

// one per thread: the addon is context-aware and loads in worker threads
std::vector<uint8_t>& Stack() {
  thread_local std::vector<uint8_t> stack;
  return stack;
}
std::vector<bodyscan::Scanner::Span>& Spans() {
  thread_local std::vector<bodyscan::Scanner::Span> spans;
  return spans;
}

napi_value Throw(napi_env env, const char* msg) {
  napi_throw_type_error(env, nullptr, msg);
  return nullptr;
}

bool Typed(napi_env env, napi_value v, napi_typedarray_type want, void** data, size_t* len) {
  napi_typedarray_type type;
  if (napi_get_typedarray_info(env, v, &type, len, data, nullptr, nullptr) != napi_ok || type != want) return false;
  if (*data == nullptr) *len = 0;
  return true;
}

napi_value ScanRequestBody(napi_env env, napi_callback_info info) {
  size_t argc = 5;
  napi_value argv[5];
  if (napi_get_cb_info(env, info, &argc, argv, nullptr, nullptr) != napi_ok || argc != 5)
    return Throw(env, "scanRequestBody(body, kind, maxDepth, out, meta) takes 5 arguments");
  void* body = nullptr;
  size_t body_len = 0;
  void* out = nullptr;
  size_t out_len = 0;
  void* meta = nullptr;
  size_t meta_len = 0;
  int32_t kind = 0;
  int32_t max_depth = 0;
  if (!Typed(env, argv[0], napi_uint8_array, &body, &body_len)) return Throw(env, "body must be a Uint8Array");
  if (napi_get_value_int32(env, argv[1], &kind) != napi_ok) return Throw(env, "kind must be a number");
  if (napi_get_value_int32(env, argv[2], &max_depth) != napi_ok) return Throw(env, "maxDepth must be a number");
  if (!Typed(env, argv[3], napi_uint8_array, &out, &out_len)) return Throw(env, "out must be a Uint8Array");
  if (!Typed(env, argv[4], napi_int32_array, &meta, &meta_len) || meta_len < static_cast<size_t>(bodyscan::kMetaInts))
    return Throw(env, "meta must be an Int32Array of at least 1282 ints");
  int32_t* m = static_cast<int32_t*>(meta);
  m[0] = 0;
  m[1] = 0;
  bodyscan::Out o{static_cast<uint8_t*>(out), out_len};
  bodyscan::Scanner s(static_cast<const uint8_t*>(body), body_len, max_depth, Stack(), Spans());
  int status = s.Scan(kind, o, m);
  napi_value r;
  napi_create_int32(env, status, &r);
  return r;
}

}  // namespace

void InitBodyScan(Napi::Env env, Napi::Object exports) {
  napi_value fn;
  napi_create_function(env, "scanRequestBody", NAPI_AUTO_LENGTH, ScanRequestBody, nullptr, &fn);
  exports.Set("scanRequestBody", Napi::Value(env, fn));
}

}  // namespace switchyard
