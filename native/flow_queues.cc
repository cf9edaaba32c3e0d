// Per-flow request queues shared by every thread of the process.
//
// A region (N flows x one bounded ring each) lives in a process-global
// registry under a numeric handle. The thread that creates it and every
// worker_thread that attaches to the handle hold one reference each; the
// memory is freed when the last reference goes (close(), garbage collection
// of the JS object, or teardown of the thread's environment, whichever comes
// first). Pushes and pops never take a lock; only create/attach/release do.
#include "flow_queues.h"

#include <cmath>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>
#include <vector>

#include "flow_ring.h"

namespace switchyard {
namespace {

using flow::Record;
using flow::Ring;

constexpr uint32_t kMaxFlows = 1u << 16;
constexpr uint32_t kMaxCapacity = 1u << 24;
// Upper bound for one region's ring memory (24 bytes per cell).
constexpr uint64_t kMaxRegionCells = (1ull << 30) / 24;
constexpr uint32_t kRecordWords = 4;  // [idLow, idHigh, bytes, time]
constexpr double kMaxSafeInteger = 9007199254740991.0;

// A flow's ring is allocated on its first push, so a region sized for many
// flows costs memory only for the flows that are used.
struct Region {
  uint32_t handle = 0;
  uint32_t flows = 0;
  uint32_t capacity = 0;
  uint32_t refs = 0;  // guarded by the registry mutex
  std::unique_ptr<std::atomic<Ring*>[]> rings;

  ~Region() {
    if (!rings) return;
    for (uint32_t f = 0; f < flows; f++) delete rings[f].load(std::memory_order_relaxed);
  }

  // The flow's ring, or nullptr when nothing was ever pushed to it.
  Ring* Get(uint32_t f) const noexcept { return rings[f].load(std::memory_order_acquire); }

  // The flow's ring, allocated on first use (racing threads agree on one);
  // nullptr only when memory runs out.
  Ring* GetOrCreate(uint32_t f) noexcept {
    Ring* ring = rings[f].load(std::memory_order_acquire);
    if (ring != nullptr) return ring;
    Ring* fresh = new (std::nothrow) Ring(capacity);
    if (fresh == nullptr) return nullptr;
    if (!fresh->ok()) {
      delete fresh;
      return nullptr;
    }
    Ring* expected = nullptr;
    if (rings[f].compare_exchange_strong(expected, fresh, std::memory_order_acq_rel, std::memory_order_acquire)) {
      return fresh;
    }
    delete fresh;  // another thread installed one first
    return expected;
  }
};

struct Registry {
  std::mutex mu;
  std::unordered_map<uint32_t, Region*> regions;
  uint32_t next_handle = 1;
};

// Never destroyed: worker threads may still release references while the
// process exits, after static destructors would have run.
Registry& GetRegistry() {
  static Registry* registry = new Registry();
  return *registry;
}

// One JS object's reference to a region. Release() is idempotent.
struct Attachment {
  Region* region = nullptr;

  void Release() {
    if (region == nullptr) return;
    Registry& reg = GetRegistry();
    Region* dead = nullptr;
    {
      std::lock_guard<std::mutex> lock(reg.mu);
      if (--region->refs == 0) {
        reg.regions.erase(region->handle);
        dead = region;
      }
    }
    region = nullptr;
    delete dead;
  }
};

// Per-environment (main thread or one worker) list of attachments, released
// by a cleanup hook when the environment tears down.
struct EnvState {
  std::vector<std::weak_ptr<Attachment>> attachments;

  void Track(const std::shared_ptr<Attachment>& a) {
    // Drop entries of objects already collected, so the list stays small.
    std::erase_if(attachments, [](const std::weak_ptr<Attachment>& w) { return w.expired(); });
    attachments.push_back(a);
  }

  static void Cleanup(void* arg) {
    auto* self = static_cast<EnvState*>(arg);
    for (auto& w : self->attachments) {
      if (auto a = w.lock()) a->Release();
    }
    delete self;
  }
};

// Formats a number for an error message without a trailing ".000000".
std::string Fmt(double v) {
  if (std::isfinite(v) && std::trunc(v) == v && std::fabs(v) < 1e18) return std::to_string(static_cast<int64_t>(v));
  return std::to_string(v);
}

Napi::Value ThrowType(Napi::Env env, const std::string& msg) {
  Napi::TypeError::New(env, msg).ThrowAsJavaScriptException();
  return env.Undefined();
}

Napi::Value ThrowRange(Napi::Env env, const std::string& msg) {
  Napi::RangeError::New(env, msg).ThrowAsJavaScriptException();
  return env.Undefined();
}

// Reads an integer argument in [lo, hi]; throws and returns false otherwise.
bool ArgInt(const Napi::CallbackInfo& info, size_t i, const char* name, double lo, double hi, double* out) {
  Napi::Env env = info.Env();
  if (i >= info.Length() || !info[i].IsNumber()) {
    ThrowType(env, std::string(name) + " must be a number");
    return false;
  }
  const double v = info[i].As<Napi::Number>().DoubleValue();
  if (!std::isfinite(v) || std::trunc(v) != v || v < lo || v > hi) {
    ThrowRange(env, std::string(name) + " must be an integer in [" + std::to_string(static_cast<uint64_t>(lo)) +
                        ", " + std::to_string(static_cast<uint64_t>(hi)) + "], got " + Fmt(v));
    return false;
  }
  *out = v;
  return true;
}

// Reads a Uint32Array argument; throws and returns false otherwise.
bool ArgU32Array(const Napi::CallbackInfo& info, size_t i, const char* name, uint32_t** data, size_t* len) {
  if (i >= info.Length() || !info[i].IsTypedArray() ||
      info[i].As<Napi::TypedArray>().TypedArrayType() != napi_uint32_array) {
    ThrowType(info.Env(), std::string(name) + " must be a Uint32Array");
    return false;
  }
  auto arr = info[i].As<Napi::Uint32Array>();
  *data = arr.Data();
  *len = arr.ElementLength();
  return true;
}

// Reads the (records: Uint32Array, count) pair of the batch calls at arguments 1
// and 2: count records of kRecordWords words must fit. Throws and returns false otherwise.
bool ArgRecordBatch(const Napi::CallbackInfo& info, const char* arrName, const char* countName, uint32_t** data,
                    uint32_t* count) {
  size_t len;
  double n;
  if (!ArgU32Array(info, 1, arrName, data, &len)) return false;
  if (!ArgInt(info, 2, countName, 0, 4294967295.0, &n)) return false;
  if (n * kRecordWords > static_cast<double>(len)) {
    ThrowRange(info.Env(), std::string(arrName) + " holds " + std::to_string(len / kRecordWords) + " records, " +
                               countName + " is " + std::to_string(static_cast<uint64_t>(n)));
    return false;
  }
  *count = static_cast<uint32_t>(n);
  return true;
}

uint32_t RoundUpPow2(uint32_t v) {
  uint32_t p = 2;
  while (p < v) p <<= 1;
  return p;
}

class FlowQueuesWrap : public Napi::ObjectWrap<FlowQueuesWrap> {
 public:
  static Napi::Function Define(Napi::Env env, EnvState* state) {
    return DefineClass(env, "FlowQueues",
                       {
                           InstanceMethod<&FlowQueuesWrap::Enqueue>("enqueue"),
                           InstanceMethod<&FlowQueuesWrap::EnqueueBatch>("enqueueBatch"),
                           InstanceMethod<&FlowQueuesWrap::DequeueBatch>("dequeueBatch"),
                           InstanceMethod<&FlowQueuesWrap::Peek>("peek"),
                           InstanceMethod<&FlowQueuesWrap::Size>("size"),
                           InstanceMethod<&FlowQueuesWrap::Sizes>("sizes"),
                           InstanceMethod<&FlowQueuesWrap::Close>("close"),
                           InstanceAccessor<&FlowQueuesWrap::GetHandle>("handle"),
                           InstanceAccessor<&FlowQueuesWrap::GetFlows>("flows"),
                           InstanceAccessor<&FlowQueuesWrap::GetCapacity>("capacity"),
                           InstanceAccessor<&FlowQueuesWrap::GetClosed>("closed"),
                           StaticMethod<&FlowQueuesWrap::LiveRegions>("liveRegions"),
                       },
                       state);
  }

  // new FlowQueues(0, flows, capacity) creates a region;
  // new FlowQueues(1, handle) attaches to an existing one.
  explicit FlowQueuesWrap(const Napi::CallbackInfo& info)
      : Napi::ObjectWrap<FlowQueuesWrap>(info), attachment_(std::make_shared<Attachment>()) {
    Napi::Env env = info.Env();
    double mode;
    if (!ArgInt(info, 0, "mode", 0, 1, &mode)) return;
    Region* region = nullptr;
    if (mode == 0) {
      double flows, capacity;
      if (!ArgInt(info, 1, "flows", 1, kMaxFlows, &flows)) return;
      if (!ArgInt(info, 2, "capacity", 1, kMaxCapacity, &capacity)) return;
      const uint32_t cap = RoundUpPow2(static_cast<uint32_t>(capacity));
      if (static_cast<uint64_t>(flows) * cap > kMaxRegionCells) {
        ThrowRange(env, "flows x capacity is too large: at most " + std::to_string(kMaxRegionCells) +
                            " queued records per FlowQueues");
        return;
      }
      auto owned = std::unique_ptr<Region>(new (std::nothrow) Region());
      if (!owned) {
        ThrowRange(env, "out of memory allocating FlowQueues");
        return;
      }
      owned->flows = static_cast<uint32_t>(flows);
      owned->capacity = cap;
      owned->refs = 1;
      owned->rings.reset(new (std::nothrow) std::atomic<Ring*>[owned->flows]);
      if (!owned->rings) {
        ThrowRange(env, "out of memory allocating FlowQueues");
        return;
      }
      for (uint32_t f = 0; f < owned->flows; f++) owned->rings[f].store(nullptr, std::memory_order_relaxed);
      Registry& reg = GetRegistry();
      std::lock_guard<std::mutex> lock(reg.mu);
      owned->handle = reg.next_handle++;
      if (reg.next_handle == 0 || reg.next_handle > (1u << 31)) reg.next_handle = 1;
      region = owned.release();
      reg.regions.emplace(region->handle, region);
    } else {
      double handle;
      if (!ArgInt(info, 1, "handle", 1, 4294967295.0, &handle)) return;
      Registry& reg = GetRegistry();
      std::lock_guard<std::mutex> lock(reg.mu);
      auto it = reg.regions.find(static_cast<uint32_t>(handle));
      if (it == reg.regions.end()) {
        ThrowRange(env, "no live FlowQueues has handle " + std::to_string(static_cast<uint32_t>(handle)) +
                            " (it was closed by every thread that held it, or never existed)");
        return;
      }
      region = it->second;
      region->refs++;
    }
    attachment_->region = region;
    region_ = region;
    flows_ = region->flows;
    static_cast<EnvState*>(info.Data())->Track(attachment_);
  }

  ~FlowQueuesWrap() override { attachment_->Release(); }

 private:
  // Checks the object is open and reads the flow index argument; -1 after throwing.
  int64_t FlowArg(const Napi::CallbackInfo& info, size_t i) {
    Napi::Env env = info.Env();
    if (attachment_->region == nullptr) {
      Napi::Error::New(env, "FlowQueues is closed").ThrowAsJavaScriptException();
      return -1;
    }
    if (i >= info.Length() || !info[i].IsNumber()) {
      ThrowType(env, "flow must be a number");
      return -1;
    }
    const double f = info[i].As<Napi::Number>().DoubleValue();
    if (!(f >= 0) || f >= flows_ || std::trunc(f) != f) {
      ThrowRange(env, "flow must be an integer in [0, " + std::to_string(flows_ - 1) + "], got " + Fmt(f));
      return -1;
    }
    return static_cast<int64_t>(f);
  }

  // The ring to push into (allocated on first use); nullptr after throwing.
  Ring* PushRing(Napi::Env env, int64_t f) {
    Ring* ring = region_->GetOrCreate(static_cast<uint32_t>(f));
    if (ring == nullptr) ThrowRange(env, "out of memory allocating a flow queue");
    return ring;
  }

  // enqueue(flow, id, bytes, time) -> boolean (false when the flow's ring is full)
  Napi::Value Enqueue(const Napi::CallbackInfo& info) {
    const int64_t f = FlowArg(info, 0);
    if (f < 0) return info.Env().Undefined();
    double id, bytes, time;
    if (!ArgInt(info, 1, "id", 0, kMaxSafeInteger, &id)) return info.Env().Undefined();
    if (!ArgInt(info, 2, "bytes", 0, 4294967295.0, &bytes)) return info.Env().Undefined();
    if (!ArgInt(info, 3, "time", 0, 4294967295.0, &time)) return info.Env().Undefined();
    Ring* ring = PushRing(info.Env(), f);
    if (ring == nullptr) return info.Env().Undefined();
    const Record r{static_cast<uint64_t>(id), static_cast<uint32_t>(bytes), static_cast<uint32_t>(time)};
    return Napi::Boolean::New(info.Env(), ring->TryPush(r));
  }

  // enqueueBatch(flow, records: Uint32Array, count) -> number pushed (stops at the first full slot)
  Napi::Value EnqueueBatch(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    const int64_t f = FlowArg(info, 0);
    if (f < 0) return env.Undefined();
    uint32_t* data;
    uint32_t count;
    if (!ArgRecordBatch(info, "records", "count", &data, &count)) return env.Undefined();
    if (count == 0) return Napi::Number::New(env, 0);
    Ring* ring = PushRing(env, f);
    if (ring == nullptr) return env.Undefined();
    const uint32_t pushed = ring->TryPushMany(data, count);
    return Napi::Number::New(env, pushed);
  }

  // dequeueBatch(flow, out: Uint32Array, max) -> number popped, written to out as records
  Napi::Value DequeueBatch(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    const int64_t f = FlowArg(info, 0);
    if (f < 0) return env.Undefined();
    uint32_t* data;
    uint32_t max;
    if (!ArgRecordBatch(info, "out", "max", &data, &max)) return env.Undefined();
    Ring* ring = region_->Get(static_cast<uint32_t>(f));
    const uint32_t popped = ring == nullptr ? 0 : ring->TryPopMany(data, max);
    return Napi::Number::New(env, popped);
  }

  // peek(flow, out: Uint32Array) -> boolean; writes the head record to out[0..3]
  Napi::Value Peek(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    const int64_t f = FlowArg(info, 0);
    if (f < 0) return env.Undefined();
    uint32_t* data;
    size_t len;
    if (!ArgU32Array(info, 1, "out", &data, &len)) return env.Undefined();
    if (len < kRecordWords) return ThrowRange(env, "out must hold at least 4 elements");
    Ring* ring = region_->Get(static_cast<uint32_t>(f));
    Record r;
    if (ring == nullptr || !ring->Peek(&r)) return Napi::Boolean::New(env, false);
    data[0] = static_cast<uint32_t>(r.id);
    data[1] = static_cast<uint32_t>(r.id >> 32);
    data[2] = r.bytes;
    data[3] = r.time;
    return Napi::Boolean::New(env, true);
  }

  Napi::Value Size(const Napi::CallbackInfo& info) {
    const int64_t f = FlowArg(info, 0);
    if (f < 0) return info.Env().Undefined();
    Ring* ring = region_->Get(static_cast<uint32_t>(f));
    return Napi::Number::New(info.Env(), ring == nullptr ? 0 : ring->SizeApprox());
  }

  // sizes(out: Uint32Array) -> total; out[f] = size of flow f
  Napi::Value Sizes(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (attachment_->region == nullptr) {
      Napi::Error::New(env, "FlowQueues is closed").ThrowAsJavaScriptException();
      return env.Undefined();
    }
    uint32_t* data;
    size_t len;
    if (!ArgU32Array(info, 0, "out", &data, &len)) return env.Undefined();
    if (len < flows_) return ThrowRange(env, "out must hold at least " + std::to_string(flows_) + " elements");
    double total = 0;
    for (uint32_t f = 0; f < flows_; f++) {
      Ring* ring = region_->Get(f);
      data[f] = ring == nullptr ? 0 : ring->SizeApprox();
      total += data[f];
    }
    return Napi::Number::New(env, total);
  }

  Napi::Value Close(const Napi::CallbackInfo& info) {
    attachment_->Release();
    return info.Env().Undefined();
  }

  Napi::Value GetHandle(const Napi::CallbackInfo& info) {
    Region* r = attachment_->region;
    return r == nullptr ? info.Env().Undefined() : Napi::Number::New(info.Env(), r->handle);
  }
  Napi::Value GetFlows(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), flows_); }
  Napi::Value GetCapacity(const Napi::CallbackInfo& info) {
    Region* r = attachment_->region;
    return r == nullptr ? info.Env().Undefined() : Napi::Number::New(info.Env(), r->capacity);
  }
  Napi::Value GetClosed(const Napi::CallbackInfo& info) {
    return Napi::Boolean::New(info.Env(), attachment_->region == nullptr);
  }

  // Number of regions alive in the process (for leak and teardown tests).
  static Napi::Value LiveRegions(const Napi::CallbackInfo& info) {
    Registry& reg = GetRegistry();
    std::lock_guard<std::mutex> lock(reg.mu);
    return Napi::Number::New(info.Env(), static_cast<double>(reg.regions.size()));
  }

  std::shared_ptr<Attachment> attachment_;
  Region* region_ = nullptr;  // valid while attachment_->region is set
  uint32_t flows_ = 0;
};

}  // namespace

void InitFlowQueues(Napi::Env env, Napi::Object exports) {
  auto* state = new EnvState();
  napi_add_env_cleanup_hook(env, &EnvState::Cleanup, state);
  exports.Set("FlowQueues", FlowQueuesWrap::Define(env, state));
}

}  // namespace switchyard
