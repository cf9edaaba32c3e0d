// The N-API binding of the native HTTP/1.1 upstream client: the
// UpstreamClient class (argument checks, the hot send() path) and the bridge
// that delivers a Core's event batches to JavaScript. The connections, pools
// and timeouts are in upstream_core.h/.cc, the response parser in h1_parser.h.
#include "upstream_client.h"

#include "upstream_core.h"

namespace switchyard {
namespace {

using namespace upstream;

void ThrowType(Napi::Env env, const char* msg) { Napi::TypeError::New(env, msg).ThrowAsJavaScriptException(); }
void ThrowRange(Napi::Env env, const char* msg) { Napi::RangeError::New(env, msg).ThrowAsJavaScriptException(); }


// The JavaScript side of a Core: the onEvents callback, the shared event and
// arena buffers (kept alive by references), the async context the callback
// runs in, and the environment cleanup hook that shuts the core down when the
// environment (a worker thread) goes away. Deletes itself when the core has finished.
class JsBridge : public CoreHost {
 public:
  explicit JsBridge(napi_env env) : env_(env) {}

  bool Init(Napi::Function cb, Napi::TypedArray events, Napi::Uint8Array arena) {
    Napi::Env env(env_);
    cb_ = Napi::Persistent(cb);
    events_ref_ = Napi::Persistent(events.As<Napi::Object>());
    arena_ref_ = Napi::Persistent(arena.As<Napi::Object>());
    napi_value name;
    napi_create_string_utf8(env_, "SwitchyardUpstream", NAPI_AUTO_LENGTH, &name);
    if (napi_async_init(env_, Napi::Object::New(env), name, &async_) != napi_ok) return false;
    return true;
  }

  // core: the core this bridge serves; owner_slot: the wrap's pointer to it, cleared when the core is gone.
  void Attach(Core* core, Core** owner_slot) {
    core_ = core;
    owner_slot_ = owner_slot;
    napi_add_async_cleanup_hook(env_, &JsBridge::OnEnvCleanup, this, &cleanup_);
  }
  void Detach() { owner_slot_ = nullptr; }

  void DeliverEvents(size_t n) override {
    Napi::Env env(env_);
    Napi::HandleScope scope(env);
    napi_value fn = cb_.Value();
    napi_value recv;  // napi_make_callback wants an object receiver
    napi_get_global(env_, &recv);
    napi_value argv[1];
    napi_create_uint32(env_, static_cast<uint32_t>(n), &argv[0]);
    napi_value result;
    napi_status s = napi_make_callback(env_, async_, recv, fn, 1, argv, &result);
    if (s == napi_pending_exception) {
      napi_value err;
      napi_get_and_clear_last_exception(env_, &err);
      napi_fatal_exception(env_, err);
    }
  }

  void ReleaseShared() override {
    cb_.Reset();
    events_ref_.Reset();
    arena_ref_.Reset();
    if (async_ != nullptr) napi_async_destroy(env_, async_);
    async_ = nullptr;
  }

  void CoreFinished() override {
    if (cleanup_ != nullptr) napi_remove_async_cleanup_hook(cleanup_);
    cleanup_ = nullptr;
    if (owner_slot_ != nullptr) *owner_slot_ = nullptr;
    delete this;
  }

 private:
  static void OnEnvCleanup(napi_async_cleanup_hook_handle handle, void* arg) {
    static_cast<JsBridge*>(arg)->core_->Shutdown();
  }

  napi_env env_;
  Core* core_ = nullptr;
  Core** owner_slot_ = nullptr;
  Napi::FunctionReference cb_;
  Napi::ObjectReference events_ref_;
  Napi::ObjectReference arena_ref_;
  napi_async_context async_ = nullptr;
  napi_async_cleanup_hook_handle cleanup_ = nullptr;
};

// ---- the JS class -----------------------------------------------------------------------------

class UpstreamClientWrap : public Napi::ObjectWrap<UpstreamClientWrap> {
 public:
  static Napi::Function Define(Napi::Env env) {
    return DefineClass(env, "UpstreamClient",
                       {
                           InstanceMethod<&UpstreamClientWrap::AddPool>("addPool"),
                           InstanceMethod<&UpstreamClientWrap::Send>("send"),
                           InstanceMethod<&UpstreamClientWrap::Abort>("abort"),
                           InstanceMethod<&UpstreamClientWrap::Pause>("pause"),
                           InstanceMethod<&UpstreamClientWrap::Resume>("resume"),
                           InstanceMethod<&UpstreamClientWrap::Close>("close"),
                           InstanceMethod<&UpstreamClientWrap::ClosePool>("closePool"),
                           InstanceMethod<&UpstreamClientWrap::Destroy>("destroy"),
                           InstanceMethod<&UpstreamClientWrap::ContentType>("contentType"),
                           InstanceMethod<&UpstreamClientWrap::Stats>("stats"),
                       });
  }

  // new UpstreamClient(onEvents, events: Int32Array, arena: Uint8Array,
  //                    connectTimeoutMs, headersTimeoutMs, bodyTimeoutMs, connectionsPerEndpoint)
  explicit UpstreamClientWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<UpstreamClientWrap>(info) {
    Napi::Env env = info.Env();
    if (info.Length() < 7 || !info[0].IsFunction()) { ThrowType(env, "onEvents must be a function"); return; }
    if (!info[1].IsTypedArray() || info[1].As<Napi::TypedArray>().TypedArrayType() != napi_int32_array)
      { ThrowType(env, "events must be an Int32Array"); return; }
    if (!info[2].IsTypedArray() || info[2].As<Napi::TypedArray>().TypedArrayType() != napi_uint8_array)
      { ThrowType(env, "arena must be a Uint8Array"); return; }
    Napi::TypedArray events = info[1].As<Napi::TypedArray>();
    Napi::Uint8Array arena = info[2].As<Napi::Uint8Array>();
    if (events.ByteLength() < sizeof(Event) * 16 || events.ByteOffset() % 8 != 0)
      { ThrowRange(env, "events must hold at least 16 records (128 int32s) and be 8-byte aligned"); return; }
    if (arena.ByteLength() < kMinArena || arena.ByteLength() > (1u << 30))
      { ThrowRange(env, "arena must be between 256 KiB and 1 GiB"); return; }
    uint32_t ms[4];
    for (int i = 0; i < 4; i++) {
      if (!info[3 + i].IsNumber()) { ThrowType(env, "timeouts and connectionsPerEndpoint must be numbers"); return; }
      double v = info[3 + i].As<Napi::Number>().DoubleValue();
      if (!(v >= 0 && v <= 86400000) || v != static_cast<double>(static_cast<uint32_t>(v)))
        { ThrowRange(env, "timeouts must be integers in [0, 86400000] ms"); return; }
      ms[i] = static_cast<uint32_t>(v);
    }
    if (ms[3] < 1 || ms[3] > 65536) { ThrowRange(env, "connectionsPerEndpoint must be in [1, 65536]"); return; }
    uv_loop_t* loop = nullptr;
    if (napi_get_uv_event_loop(env, &loop) != napi_ok || loop == nullptr)
      { Napi::Error::New(env, "no event loop").ThrowAsJavaScriptException(); return; }
    JsBridge* bridge = new JsBridge(env);
    if (!bridge->Init(info[0].As<Napi::Function>(), events, arena)) {
      delete bridge;
      { Napi::Error::New(env, "cannot create the async context").ThrowAsJavaScriptException(); return; }
    }
    core_ = new Core(loop);
    Event* ev = reinterpret_cast<Event*>(static_cast<uint8_t*>(events.ArrayBuffer().Data()) + events.ByteOffset());
    core_->Init(bridge, ev, events.ByteLength() / sizeof(Event), reinterpret_cast<char*>(arena.Data()), arena.ByteLength());
    core_->Configure(ms[0], ms[1], ms[2], ms[3]);
    bridge->Attach(core_, &core_);
  }

  ~UpstreamClientWrap() override {
    if (core_ != nullptr) {
      Core* core = core_;
      core_ = nullptr;
      static_cast<JsBridge*>(core->host())->Detach();  // no pointer back into this wrap
      core->Shutdown();
    }
  }

 private:

  bool Ready(const Napi::CallbackInfo& info) {
    if (core_ == nullptr || core_->shutting_down()) {
      Napi::Error::New(info.Env(), "the upstream client is shut down").ThrowAsJavaScriptException();
      return false;
    }
    return true;
  }

  static bool GetId(const Napi::CallbackInfo& info, size_t i, int32_t* out) {
    if (!info[i].IsNumber()) {
      ThrowType(info.Env(), "call id must be a number");
      return false;
    }
    int32_t v = info[i].As<Napi::Number>().Int32Value();
    if (v < 0) {
      ThrowRange(info.Env(), "call id must be a non-negative int32");
      return false;
    }
    *out = v;
    return true;
  }

  // addPool(poolId, ip, port)
  void AddPool(const Napi::CallbackInfo& info) {
    if (!Ready(info)) return;
    Napi::Env env = info.Env();
    if (!info[0].IsNumber() || !info[1].IsString() || !info[2].IsNumber())
      return ThrowType(env, "addPool(poolId: number, ip: string, port: number)");
    double id = info[0].As<Napi::Number>().DoubleValue();
    double port = info[2].As<Napi::Number>().DoubleValue();
    if (!(id >= 0 && id < 1 << 20) || id != static_cast<double>(static_cast<uint32_t>(id)))
      return ThrowRange(env, "poolId must be an integer in [0, 2^20)");
    if (!(port >= 1 && port <= 65535) || port != static_cast<double>(static_cast<uint32_t>(port)))
      return ThrowRange(env, "port must be an integer in [1, 65535]");
    std::string ip = info[1].As<Napi::String>().Utf8Value();
    if (!core_->AddPool(static_cast<uint32_t>(id), ip, static_cast<uint32_t>(port)))
      return ThrowType(env, "ip must be an IPv4 or IPv6 address literal");
  }

  // send(id, poolId, head: string (latin1), body: Uint8Array | null)
  // On the hot path: four N-API calls after the wrapper's own two (each value is
  // read with the call that also checks its type; the head string goes straight
  // into a buffer kept between calls).
  void Send(const Napi::CallbackInfo& info) {
    if (!Ready(info)) return;
    Napi::Env env = info.Env();
    int32_t id;
    if (napi_get_value_int32(env, info[0], &id) != napi_ok) return ThrowType(env, "call id must be a number");
    if (id < 0) return ThrowRange(env, "call id must be a non-negative int32");
    uint32_t pool_id;
    if (napi_get_value_uint32(env, info[1], &pool_id) != napi_ok) return ThrowType(env, "poolId must be a number");
    Pool* pool = core_->GetPool(pool_id);
    if (pool == nullptr) return ThrowRange(env, "unknown poolId (addPool first)");
    if (head_.size() < kHeadBuf) head_.resize(kHeadBuf);
    size_t hl = 0;
    if (napi_get_value_string_latin1(env, info[2], head_.data(), head_.size(), &hl) != napi_ok)
      return ThrowType(env, "head must be a string");
    if (hl + 1 >= head_.size()) {
      // it may not have fitted: ask for the length, then copy it whole
      if (napi_get_value_string_latin1(env, info[2], nullptr, 0, &hl) != napi_ok) return ThrowType(env, "head must be a string");
      head_.resize(hl + 1);
      napi_get_value_string_latin1(env, info[2], head_.data(), hl + 1, &hl);
    }
    if (hl == 0) return ThrowRange(env, "head must not be empty");
    const uint8_t* bp = nullptr;
    size_t bl = 0;
    napi_typedarray_type type;
    void* data = nullptr;
    if (napi_get_typedarray_info(env, info[3], &type, &bl, &data, nullptr, nullptr) == napi_ok) {
      if (type != napi_uint8_array) return ThrowType(env, "body must be a Uint8Array or null");
      bp = static_cast<const uint8_t*>(data);
    } else {
      napi_valuetype vt;
      if (napi_typeof(env, info[3], &vt) != napi_ok || (vt != napi_null && vt != napi_undefined))
        return ThrowType(env, "body must be a Uint8Array or null");
      bl = 0;
    }
    if (bl > 0xffffffffu - hl) return ThrowRange(env, "request too large");
    if (!core_->Send(id, pool, head_.data(), hl, bp, bl)) return ThrowRange(env, "call slot is in use");
  }

  void Abort(const Napi::CallbackInfo& info) {
    int32_t id;
    if (core_ == nullptr || !GetId(info, 0, &id)) return;
    core_->Abort(id);
  }
  void Pause(const Napi::CallbackInfo& info) {
    int32_t id;
    if (core_ == nullptr || !GetId(info, 0, &id)) return;
    core_->Pause(id);
  }
  void Resume(const Napi::CallbackInfo& info) {
    int32_t id;
    if (core_ == nullptr || !GetId(info, 0, &id)) return;
    core_->Resume(id);
  }
  void Close(const Napi::CallbackInfo& info) {
    if (core_ != nullptr) core_->CloseClient();
  }

  // closePool(poolId): the endpoint is gone (see Core::ClosePool).
  void ClosePool(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    uint32_t pool_id;
    if (napi_get_value_uint32(env, info[0], &pool_id) != napi_ok) return ThrowType(env, "closePool(poolId: number)");
    if (core_ != nullptr) core_->ClosePool(pool_id);
  }

  // destroy(): closes every connection now (no events follow) and frees the native state.
  void Destroy(const Napi::CallbackInfo& info) {
    if (core_ != nullptr) core_->Shutdown();
  }

  // contentType(index) -> string: the content type an event named by index.
  Napi::Value ContentType(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (core_ == nullptr || !info[0].IsNumber()) return Napi::String::New(env, "");
    const std::string* s = core_->ContentType(info[0].As<Napi::Number>().Uint32Value());
    if (s == nullptr) return Napi::String::New(env, "");
    napi_value v;
    napi_create_string_latin1(env, s->data(), s->size(), &v);
    return Napi::Value(env, v);
  }

  // stats() -> [flushes, events delivered, connections opened, open connections]
  Napi::Value Stats(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Napi::Array a = Napi::Array::New(env, 4);
    a.Set(0u, Napi::Number::New(env, core_ ? core_->flushes() : 0));
    a.Set(1u, Napi::Number::New(env, core_ ? core_->delivered() : 0));
    a.Set(2u, Napi::Number::New(env, core_ ? core_->opened() : 0));
    a.Set(3u, Napi::Number::New(env, core_ ? core_->OpenConnections() : 0));
    return a;
  }

  static constexpr size_t kHeadBuf = 4096;
  Core* core_ = nullptr;
  std::vector<char> head_;
};

}  // namespace

void InitUpstreamClient(Napi::Env env, Napi::Object exports) {
  exports.Set("UpstreamClient", UpstreamClientWrap::Define(env));
}

}  // namespace switchyard
