#pragma once
#include <napi.h>

namespace switchyard {
// Registers the UpstreamClient class (the native HTTP/1.1 upstream client) on the addon's exports.
void InitUpstreamClient(Napi::Env env, Napi::Object exports);
}  // namespace switchyard
