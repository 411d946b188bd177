// Callgrind's client requests for Tools/ferry-cost: only the measured section is counted.
// Without valgrind's headers the requests compile to nothing and the tool says so.
#include "CFerryCost.h"

#if defined(__has_include)
#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#define FERRY_HAVE_CALLGRIND 1
#endif
#endif

void ferry_cost_start(void) {
#ifdef FERRY_HAVE_CALLGRIND
  CALLGRIND_ZERO_STATS;
  CALLGRIND_START_INSTRUMENTATION;
#endif
}

void ferry_cost_stop(void) {
#ifdef FERRY_HAVE_CALLGRIND
  CALLGRIND_STOP_INSTRUMENTATION;
#endif
}

int ferry_cost_available(void) {
#ifdef FERRY_HAVE_CALLGRIND
  return 1;
#else
  return 0;
#endif
}
