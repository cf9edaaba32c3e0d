#pragma once
#include <napi.h>

namespace switchyard {
// Registers h1ParseForTest (a test-only probe of the HTTP/1.1 response parser) on the addon's exports.
void InitH1ParserProbe(Napi::Env env, Napi::Object exports);
}  // namespace switchyard
