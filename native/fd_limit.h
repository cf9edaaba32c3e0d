#pragma once
#include <napi.h>

namespace switchyard {
// Registers raiseFdLimit() on the addon's exports.
void InitFdLimit(Napi::Env env, Napi::Object exports);
}  // namespace switchyard
