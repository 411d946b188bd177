#ifndef FERRY_CLMDB_SHIM_H
#define FERRY_CLMDB_SHIM_H
#include <lmdb.h>
#endif
