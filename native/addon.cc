// Module entry point of the Switchyard native addon. Each component registers
// its classes here; the addon is context-aware, so it loads in worker threads.
#include <napi.h>

#include "prefix_index.h"
#include "flow_queues.h"
#include "upstream_client.h"
#include "h1_parser_probe.h"
#include "h1_request_probe.h"
#include "front_server.h"
#include "fd_limit.h"
#include "body_scan_napi.h"

namespace {

Napi::Object Init(Napi::Env env, Napi::Object exports) {
  switchyard::InitPrefixIndex(env, exports);
  switchyard::InitFlowQueues(env, exports);
  switchyard::InitUpstreamClient(env, exports);
  switchyard::InitH1ParserProbe(env, exports);
  switchyard::InitH1RequestProbe(env, exports);
  switchyard::InitFrontServer(env, exports);
  switchyard::InitFdLimit(env, exports);
  switchyard::InitBodyScan(env, exports);
  exports.Set("abiVersion", Napi::Number::New(env, 8)); // 2: the upstream client; 3: h1ParseForTest, raiseFdLimit; 4: lowestFreeFd; 5: PrefixIndex.applyEvents; 6: UpstreamClient.closePool; 7: PrefixIndex.applyPayloads, setEventMapLimit; 8: scanRequestBody
  return exports;
}

}  // namespace

NODE_API_MODULE(switchyard_native, Init)
