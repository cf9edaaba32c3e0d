#pragma once
#include <napi.h>

namespace switchyard {
// Registers FrontServer (the native HTTP/1.1 front end, native/front_server.cc) on the addon's exports.
void InitFrontServer(Napi::Env env, Napi::Object exports);
}  // namespace switchyard
