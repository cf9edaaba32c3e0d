#include "flow_queues.h"

namespace switchyard {
void InitFlowQueues(Napi::Env env, Napi::Object exports) {}
}  // namespace switchyard
