#pragma once
#include <napi.h>

namespace switchyard {
// Registers the PrefixIndex class on the addon's exports.
void InitPrefixIndex(Napi::Env env, Napi::Object exports);
}  // namespace switchyard
