// The chaining SIGINT handler of interrupt.h.
#include "interrupt.h"

#include <csignal>
#include <mutex>

#include "qkv/parallel.h"

namespace qkv::python {

namespace {

std::mutex g_mutex;
int g_active = 0;                  // InterruptScopes alive (guarded by g_mutex)
bool g_installed = false;          // our handler is in place (guarded by g_mutex)
struct sigaction g_previous = {};  // the handler we replaced; read by on_sigint

void on_sigint(int sig, siginfo_t* info, void* context) {
  request_interrupt();
  // Chain: Python's C handler records the signal (and writes its wakeup fd).
  if (g_previous.sa_flags & SA_SIGINFO) {
    g_previous.sa_sigaction(sig, info, context);
  } else {
    g_previous.sa_handler(sig);
  }
}

bool is_function(const struct sigaction& action) {
  if (action.sa_flags & SA_SIGINFO) return action.sa_sigaction != nullptr;
  return action.sa_handler != SIG_DFL && action.sa_handler != SIG_IGN && action.sa_handler != nullptr;
}

}  // namespace

InterruptScope::InterruptScope() {
  const std::lock_guard<std::mutex> lock(g_mutex);
  if (g_active++ > 0) return;
  clear_interrupt();
  struct sigaction current = {};
  if (sigaction(SIGINT, nullptr, &current) != 0 || !is_function(current)) return;
  g_previous = current;
  struct sigaction ours = {};
  ours.sa_sigaction = on_sigint;
  ours.sa_flags = SA_SIGINFO | SA_ONSTACK | (current.sa_flags & SA_RESTART);
  sigemptyset(&ours.sa_mask);
  g_installed = sigaction(SIGINT, &ours, nullptr) == 0;
}

InterruptScope::~InterruptScope() {
  const std::lock_guard<std::mutex> lock(g_mutex);
  if (--g_active > 0) return;
  if (g_installed) {
    struct sigaction current = {};
    // Put the old handler back only over ours: a handler set meanwhile stays.
    if (sigaction(SIGINT, nullptr, &current) == 0 && (current.sa_flags & SA_SIGINFO) &&
        current.sa_sigaction == on_sigint) {
      sigaction(SIGINT, &g_previous, nullptr);
    }
    g_installed = false;
  }
  clear_interrupt();
}

}  // namespace qkv::python
