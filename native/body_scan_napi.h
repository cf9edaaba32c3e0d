#pragma once
#include <napi.h>

namespace switchyard {
// Registers scanRequestBody() (body_scan.cc) on the addon's exports.
void InitBodyScan(Napi::Env env, Napi::Object exports);
}  // namespace switchyard
