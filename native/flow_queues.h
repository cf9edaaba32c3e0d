#pragma once
#include <napi.h>

namespace switchyard {
// Registers the FlowQueues class on the addon's exports.
void InitFlowQueues(Napi::Env env, Napi::Object exports);
}  // namespace switchyard
