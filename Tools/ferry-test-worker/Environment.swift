// Modes that work on a store's LMDB environment below the event log: growing the map, holding the
// writer lock, leaving a commit unpublished.
import CFerryLMDB
import FerryLog
import Foundation
import LMDB

/// Opens the environment at `directory` through LMDB's C API with `flags`, or ends the process.
private func openRawEnvironment(_ directory: String, flags: Int32) -> OpaquePointer {
  var env: OpaquePointer?
  guard mdb_env_create(&env) == MDB_SUCCESS, let env else { fail("mdb_env_create failed") }
  guard mdb_env_set_maxdbs(env, 64) == MDB_SUCCESS,
    mdb_env_open(env, directory, UInt32(flags), 0o600) == MDB_SUCCESS
  else { fail("opening \(directory) failed") }
  return env
}

let environmentModes: [String: Mode] = [
  // Writes into database "data" until the map has grown to at least BYTES; says "mapsize M".
  "grow-map": Mode(usage: "DIR BYTES") { call in
    call.expect(1...1)
    let target = call.number(0)
    do {
      let env = try Environment.open(path: call.directory, databases: ["data"])
      let db = try env.database("data")
      var key: UInt64 = 1 << 32
      while env.mapSize < target {
        try env.write { txn in
          for _ in 0..<64 {
            key += 1
            try txn.put(db, key: key.bigEndianBytes, value: [UInt8](repeating: 7, count: 4096))
          }
        }
      }
      say("mapsize \(env.mapSize)")
      env.close()
    } catch {
      fail("grow-map failed: \(error)")
    }
  },
  // Opens the store's LMDB environment and begins a write transaction, which holds LMDB's writer
  // lock (every other process's commit waits), says "locked", and on a line on standard input
  // aborts it, closes and says "released".
  "hold-write-lock": Mode(usage: "DIR") { call in
    let env = openRawEnvironment(call.directory, flags: MDB_NOTLS)
    var txn: OpaquePointer?
    guard mdb_txn_begin(env, nil, 0, &txn) == MDB_SUCCESS, let txn else {
      fail("beginning a write transaction failed")
    }
    say("locked")
    _ = readLine()
    mdb_txn_abort(txn)
    mdb_env_close(env)
    say("released")
  },
  // Holds the store's open lock (ferry-open.lock) shared without opening LMDB, as a Ferry open
  // does between taking it and opening LMDB (or while it copies a store to read a recovered
  // copy), until a line comes on stdin. Says "locked", then "released".
  "hold-open-lock": Mode(usage: "DIR") { call in
    let fd = open(call.directory + "/ferry-open.lock", O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
    var request = flock()
    request.l_type = Int16(F_RDLCK)
    request.l_whence = Int16(SEEK_SET)
    guard fd >= 0, fcntl(fd, F_SETLKW, &request) == 0 else { fail("locking ferry-open.lock failed") }
    say("locked")
    _ = readLine()
    close(fd)
    say("released")
  },
  // Commits one key ("k" = "v") into the database "unpublished" through an environment opened with
  // MDB_NOLOCK, which never touches lock.mdb: the data file's newest meta page then names a
  // transaction that processes sharing lock.mdb do not see — the state every commit is in from its
  // meta-page write to its publication in lock.mdb, held here for as long as the test needs. Says
  // "committed TXN".
  "unpublished-commit": Mode(usage: "DIR") { call in
    let env = openRawEnvironment(call.directory, flags: MDB_NOLOCK | MDB_NOTLS)
    var txn: OpaquePointer?
    var dbi = MDB_dbi(0)
    guard mdb_txn_begin(env, nil, 0, &txn) == MDB_SUCCESS, let txn,
      mdb_dbi_open(txn, "unpublished", UInt32(MDB_CREATE), &dbi) == MDB_SUCCESS
    else { fail("beginning the unpublished commit failed") }
    let id = mdb_txn_id(txn)
    var key = Array("k".utf8)
    var value = Array("v".utf8)
    let put = key.withUnsafeMutableBytes { k in
      value.withUnsafeMutableBytes { v in
        var keyValue = MDB_val(mv_size: k.count, mv_data: k.baseAddress)
        var dataValue = MDB_val(mv_size: v.count, mv_data: v.baseAddress)
        return mdb_put(txn, dbi, &keyValue, &dataValue, 0)
      }
    }
    guard put == MDB_SUCCESS, mdb_txn_commit(txn) == MDB_SUCCESS else {
      fail("the unpublished commit failed")
    }
    mdb_env_close(env)
    say("committed \(id)")
  },
]
