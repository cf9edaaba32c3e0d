#pragma once
#include <napi.h>

namespace switchyard {
// Registers h1RequestParseForTest (a test-only probe of the strict request parser) on the addon's exports.
void InitH1RequestProbe(Napi::Env env, Napi::Object exports);
}  // namespace switchyard
