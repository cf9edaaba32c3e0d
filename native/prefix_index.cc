#include "prefix_index.h"

namespace switchyard {
void InitPrefixIndex(Napi::Env env, Napi::Object exports) {}
}  // namespace switchyard
