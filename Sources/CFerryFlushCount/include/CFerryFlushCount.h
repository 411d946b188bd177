#ifndef CFERRYFLUSHCOUNT_H
#define CFERRYFLUSHCOUNT_H

/// Flushes to the disk (`fsync`, `fdatasync`, `msync`) made by this process since it started,
/// by Ferry, by LMDB and by SQLite alike: the benchmark defines those functions itself, counts, and
/// calls the C library's.
long ferry_flush_count(void);

#endif
