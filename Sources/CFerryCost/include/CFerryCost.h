#ifndef CFERRYCOST_H
#define CFERRYCOST_H

/// Starts counting instructions under valgrind's callgrind (nothing when not under callgrind).
void ferry_cost_start(void);
/// Stops counting instructions under callgrind (nothing when not under callgrind).
void ferry_cost_stop(void);
/// Whether callgrind's client requests were compiled in (the valgrind headers were found).
int ferry_cost_available(void);

#endif
