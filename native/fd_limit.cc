// raiseFdLimit(): raises RLIMIT_NOFILE's soft limit to its hard limit, so a
// router holding many upstream and client sockets does not run out of file
// descriptors at the distribution default (often 1024). Returns the limits
// after the call; throws an Error when the platform refuses.
#include "fd_limit.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <string>

namespace switchyard {
namespace {

double AsNumber(rlim_t v) {
  // RLIM_INFINITY has no number: report it as Infinity
  return v == RLIM_INFINITY ? std::numeric_limits<double>::infinity() : static_cast<double>(v);
}

Napi::Value RaiseFdLimit(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() != 0) {
    Napi::TypeError::New(env, "raiseFdLimit() takes no arguments").ThrowAsJavaScriptException();
    return env.Undefined();
  }
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) {
    Napi::Error::New(env, std::string("getrlimit(RLIMIT_NOFILE) failed: ") + strerror(errno)).ThrowAsJavaScriptException();
    return env.Undefined();
  }
  if (rl.rlim_cur != rl.rlim_max) {
    struct rlimit want = rl;
    want.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &want) != 0) {
#ifdef __APPLE__
      // macOS refuses an unlimited soft limit for files: OPEN_MAX is its ceiling
      want.rlim_cur = rl.rlim_max < OPEN_MAX ? rl.rlim_max : OPEN_MAX;
      if (setrlimit(RLIMIT_NOFILE, &want) != 0)
#endif
      {
        Napi::Error::New(env, std::string("setrlimit(RLIMIT_NOFILE) failed: ") + strerror(errno)).ThrowAsJavaScriptException();
        return env.Undefined();
      }
    }
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) {
      Napi::Error::New(env, std::string("getrlimit(RLIMIT_NOFILE) failed: ") + strerror(errno)).ThrowAsJavaScriptException();
      return env.Undefined();
    }
  }
  Napi::Object o = Napi::Object::New(env);
  o.Set("soft", AsNumber(rl.rlim_cur));
  o.Set("hard", AsNumber(rl.rlim_max));
  return o;
}

// lowestFreeFd(): the lowest file descriptor number not in use, or -1 when
// none is free below the soft limit. The kernel hands out the lowest free
// number, so this is how full the table is, for two system calls (a dup of a
// descriptor held open for the purpose, and its close) and no /proc walk.
int probe_fd = -1;

Napi::Value LowestFreeFd(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() != 0) {
    Napi::TypeError::New(env, "lowestFreeFd() takes no arguments").ThrowAsJavaScriptException();
    return env.Undefined();
  }
  if (probe_fd < 0) {
    probe_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (probe_fd < 0) return Napi::Number::New(env, errno == EMFILE || errno == ENFILE ? -1 : -2);
  }
  int fd = fcntl(probe_fd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return Napi::Number::New(env, errno == EMFILE || errno == ENFILE ? -1 : -2);
  close(fd);
  return Napi::Number::New(env, fd);
}

}  // namespace

void InitFdLimit(Napi::Env env, Napi::Object exports) {
  exports.Set("lowestFreeFd", Napi::Function::New(env, LowestFreeFd, "lowestFreeFd"));
  exports.Set("raiseFdLimit", Napi::Function::New<RaiseFdLimit>(env, "raiseFdLimit"));
}

}  // namespace switchyard
